package org.innetagg.onos.web;

import com.fasterxml.jackson.databind.JsonNode;
import org.innetagg.onos.aggregation.InvalidPlacementException;
import org.innetagg.onos.priority.AppliedClass;
import org.innetagg.onos.priority.JobClass;
import org.innetagg.onos.priority.TrafficClassService;
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
 * Strict-priority traffic classes of jobs (docs/onos-aggregation-api.md, "Traffic-class
 * resource"). Thin: decode, call {@link TrafficClassService}, encode; errors are
 * {@code {"code", "message"}}.
 */
@Path("priority")
public class TrafficClassWebResource extends AbstractWebResource {

    /**
     * Applies the traffic class of a job, replacing the one in force.
     *
     * @param job  job id, as in the document's job_id
     * @param body traffic-class document: job_id, priority_class (0-7), switches (optional)
     * @return 201 created, 200 replaced, 400 invalid document, 503 device not available or no free job number
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
            AppliedClass applied = get(TrafficClassService.class).apply(JobClass.decode(job, doc));
            return Response.status(applied.created ? 201 : 200).entity(applied.document()).build();
        } catch (InvalidPlacementException e) {
            return WebErrors.error(mapper(), e.status(), e.getMessage());
        }
    }

    /**
     * The traffic class in force for a job.
     *
     * @param job job id
     * @return 200 with the document, the switches written and p4_job_id, 404 when none
     */
    @GET
    @Path("{job}")
    @Produces(MediaType.APPLICATION_JSON)
    public Response show(@PathParam("job") String job) {
        Optional<AppliedClass> applied = get(TrafficClassService.class).get(job);
        return applied.map(a -> ok(a.document()).build())
                .orElseGet(() -> WebErrors.error(mapper(), 404, "job: no traffic class for '" + job + "'"));
    }

    /**
     * Removes the job's traffic_class entries.
     *
     * @param job job id
     * @return 204, also when the job had none
     */
    @DELETE
    @Path("{job}")
    public Response remove(@PathParam("job") String job) {
        get(TrafficClassService.class).remove(job);
        return Response.noContent().build();
    }
}
