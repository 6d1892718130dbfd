package org.innetagg.onos.web;

import com.fasterxml.jackson.databind.ObjectMapper;

import javax.ws.rs.core.MediaType;
import javax.ws.rs.core.Response;
import java.io.IOException;

/** The resources' error answers: {@code {"code": status, "message": "<field>: <reason>"}}. */
final class WebErrors {
    private WebErrors() {
    }

    static Response error(ObjectMapper mapper, int status, String message) {
        return Response.status(status)
                .type(MediaType.APPLICATION_JSON)
                .entity(mapper.createObjectNode().put("code", status).put("message", message))
                .build();
    }

    /** 400 naming {@code body} for a request body that does not parse as JSON. */
    static Response notJson(ObjectMapper mapper, IOException e) {
        String first = e.getMessage() == null ? "" : e.getMessage().lines().findFirst().orElse("");
        return error(mapper, 400, "body: not JSON (" + first + ")");
    }
}
