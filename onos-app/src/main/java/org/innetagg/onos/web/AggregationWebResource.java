package org.innetagg.onos.web;

import com.fasterxml.jackson.databind.JsonNode;
import org.innetagg.onos.aggregation.AggregationService;
import org.innetagg.onos.aggregation.AppliedPlacement;
import org.innetagg.onos.aggregation.InvalidPlacementException;
import org.innetagg.onos.aggregation.JobPlacement;
import org.onosproject.rest.AbstractWebResource;

import javax.ws.rs.Consumes;
import javax.ws.rs.DELETE;
import javax.ws.rs.GET;
import javax.ws.rs.POST;
import javax.ws.rs.Path;
import javax.ws.rs.PathParam;
import javax.ws.rs.Produces;
import javax.ws.rs.core.MediaType;
import javax.ws.rs.core.Response;
import java.io.IOException;
import java.io.InputStream;
import java.util.Optional;

/**
 * Aggregation placements of jobs (docs/onos-aggregation-api.md). Thin: decode, call
 * {@link AggregationService}, encode; errors are {@code {"code", "message"}}.
 */
@Path("aggregation")
public class AggregationWebResource extends AbstractWebResource {

    /**
     * Applies the aggregation placement of a job, replacing the one in force.
     *
     * @param job  job id, as in the document's jobs[0].job_id
     * @param body placement document with one job
     * @return 201 created, 200 replaced, 400 invalid document, 409 a pool overlaps another job's,
     *         503 device not available
     */
    @POST
    @Path("{job}")
    @Consumes(MediaType.APPLICATION_JSON)
    @Produces(MediaType.APPLICATION_JSON)
    public Response apply(@PathParam("job") String job, InputStream body) {
        JsonNode doc;
        try {
            doc = mapper().readTree(body);
        } catch (IOException e) {
            return WebErrors.notJson(mapper(), e);
        }
        try {
            AppliedPlacement applied = get(AggregationService.class).apply(JobPlacement.decode(job, doc));
            return Response.status(applied.created ? 201 : 200).entity(applied.document()).build();
        } catch (InvalidPlacementException e) {
            return error(e.status(), e.getMessage());
        }
    }

    /**
     * The placement in force for a job.
     *
     * @param job job id
     * @return 200 with the document and p4_job_id, 404 when none
     */
    @GET
    @Path("{job}")
    @Produces(MediaType.APPLICATION_JSON)
    public Response show(@PathParam("job") String job) {
        Optional<AppliedPlacement> applied = get(AggregationService.class).get(job);
        return applied.map(a -> ok(a.document()).build())
                .orElseGet(() -> error(404, "job: no placement for '" + job + "'"));
    }

    /**
     * Removes the job's table entries.
     *
     * @param job job id
     * @return 204, also when the job had none
     */
    @DELETE
    @Path("{job}")
    public Response remove(@PathParam("job") String job) {
        get(AggregationService.class).remove(job);
        return Response.noContent().build();
    }

    private Response error(int status, String message) {
        return WebErrors.error(mapper(), status, message);
    }
}
