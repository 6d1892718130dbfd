package org.innetagg.onos.web;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.innetagg.onos.owner.OwnerService;
import org.onosproject.rest.AbstractWebResource;

import javax.ws.rs.Consumes;
import javax.ws.rs.DELETE;
import javax.ws.rs.GET;
import javax.ws.rs.POST;
import javax.ws.rs.Path;
import javax.ws.rs.Produces;
import javax.ws.rs.QueryParam;
import javax.ws.rs.core.MediaType;
import javax.ws.rs.core.Response;
import java.io.IOException;
import java.io.InputStream;
import java.util.regex.Pattern;

/**
 * The optimizer that writes to this ONOS (docs/onos-aggregation-api.md, "Owner"): POST
 * takes or renews the claim ({@code {"owner", "holder", "ttl_s"}}), 409 while another owner's
 * is in force; GET shows it (404 when none); DELETE ?owner= lets go of it.
 */
@Path("owner")
public class OwnerWebResource extends AbstractWebResource {
    private static final Pattern NAME = Pattern.compile("[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}");
    private static final int MAX_TTL_S = 3600;

    @POST
    @Consumes(MediaType.APPLICATION_JSON)
    @Produces(MediaType.APPLICATION_JSON)
    public Response claim(InputStream body) {
        JsonNode doc;
        try {
            doc = mapper().readTree(body);
        } catch (IOException e) {
            return WebErrors.notJson(mapper(), e);
        }
        if (doc == null || !doc.isObject()) {
            return WebErrors.error(mapper(), 400, "body: a JSON object expected");
        }
        String owner = doc.path("owner").asText("");
        String holder = doc.path("holder").asText("");
        JsonNode ttl = doc.path("ttl_s");
        if (!NAME.matcher(owner).matches()) {
            return WebErrors.error(mapper(), 400, "owner: expected " + NAME.pattern());
        }
        if (!NAME.matcher(holder).matches()) {
            return WebErrors.error(mapper(), 400, "holder: expected " + NAME.pattern());
        }
        if (!ttl.isIntegralNumber() || ttl.asLong() < 1 || ttl.asLong() > MAX_TTL_S) {
            return WebErrors.error(mapper(), 400, "ttl_s: an integer from 1 to " + MAX_TTL_S + " expected");
        }
        try {
            return Response.ok(encode(get(OwnerService.class).claim(owner, holder, ttl.asLong() * 1000))).build();
        } catch (OwnerService.Taken e) {
            return WebErrors.error(mapper(), 409, e.getMessage());
        }
    }

    @GET
    @Produces(MediaType.APPLICATION_JSON)
    public Response show() {
        return get(OwnerService.class).current()
                .map(c -> ok(encode(c)).build())
                .orElseGet(() -> WebErrors.error(mapper(), 404, "owner: none"));
    }

    @DELETE
    public Response release(@QueryParam("owner") String owner) {
        get(OwnerService.class).release(owner == null ? "" : owner);
        return Response.noContent().build();
    }

    private ObjectNode encode(OwnerService.Claim c) {
        return mapper().createObjectNode().put("owner", c.owner).put("holder", c.holder)
                .put("expires_in_s", c.expiresInMs / 1000.0);
    }
}
