package org.innetagg.onos.web;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.innetagg.onos.aggregation.AggregationService;
import org.innetagg.onos.aggregation.TestTopology;
import org.junit.Before;
import org.junit.Test;

import javax.ws.rs.core.Response;
import java.io.ByteArrayInputStream;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;

/**
 * The resource's answers, one fixture per invalid input (src/test/resources/placements).
 * The resource class is called directly: ONOS 2.7 publishes no Jersey test harness we can
 * use here (onos-rest's tests jar needs its own web application).
 */
public class AggregationWebResourceTest {
    private AggregationService service;
    private AggregationWebResource resource;

    @Before
    public void setUp() {
        service = TestTopology.newManager();
        resource = new AggregationWebResource() {
            @Override
            @SuppressWarnings("unchecked")
            public <T> T get(Class<T> serviceClass) {
                return (T) service;
            }
        };
    }

    private Response post(String job, String fixture) {
        InputStream in = getClass().getResourceAsStream("/placements/" + fixture);
        return resource.apply(job, in);
    }

    private static JsonNode body(Response r) {
        return new ObjectMapper().valueToTree(r.getEntity());
    }

    private void assertBadRequest(String fixture, String fieldPrefix) {
        Response r = post("resnet-a", fixture);
        assertEquals(fixture, 400, r.getStatus());
        JsonNode body = body(r);
        assertEquals(400, body.get("code").asInt());
        assertTrue(fixture + ": " + body, body.get("message").asText().startsWith(fieldPrefix + ": "));
    }

    @Test
    public void createThenReplaceThenGetThenDelete() {
        Response created = post("resnet-a", "valid.json");
        assertEquals(201, created.getStatus());
        assertEquals(0, body(created).get("p4_job_id").asInt());
        assertEquals(200, post("resnet-a", "valid.json").getStatus());
        Response got = resource.show("resnet-a");
        assertEquals(200, got.getStatus());
        assertEquals("resnet-a", body(got).get("jobs").get(0).get("job_id").asText());
        assertEquals(204, resource.remove("resnet-a").getStatus());
        assertEquals(404, resource.show("resnet-a").getStatus());
        assertEquals(204, resource.remove("resnet-a").getStatus());
    }

    @Test
    public void unknownDevice() {
        assertBadRequest("unknown-device.json", "jobs[0].aggregators[1].switch");
    }

    @Test
    public void poolOutsideTheSwitchSlots() {
        assertBadRequest("pool-outside.json", "jobs[0].aggregators[1].pool");
    }

    @Test
    public void fanInZero() {
        assertBadRequest("fan-in-zero.json", "jobs[0].aggregators[0].fan_in");
    }

    @Test
    public void jobIdNotThePathJob() {
        assertBadRequest("job-mismatch.json", "jobs[0].job_id");
    }

    @Test
    public void twoJobsInOneDocument() {
        assertBadRequest("two-jobs.json", "jobs");
    }

    @Test
    public void nextHopWithoutLink() {
        assertBadRequest("no-route.json", "jobs[0].aggregators[0].next_hop");
    }

    @Test
    public void sameSwitchTwice() {
        assertBadRequest("same-switch-twice.json", "jobs[0].aggregators[1].switch");
    }

    @Test
    public void bodyNotJson() {
        assertBadRequest("not-json.txt", "body");
    }

    @Test
    public void badJobIdInPath() {
        Response r = post("../etc", "valid.json");
        assertEquals(400, r.getStatus());
        assertTrue(body(r).get("message").asText().startsWith("job: "));
    }

    @Test
    public void aSwitchIdThatIsNoDeviceIdIs400NamingTheField() throws Exception {
        ObjectNode doc;
        try (InputStream in = getClass().getResourceAsStream("/placements/valid.json")) {
            doc = (ObjectNode) new ObjectMapper().readTree(in);
        }
        ((ObjectNode) doc.get("jobs").get(0).get("aggregators").get(0)).put("switch", "not a uri");
        Response r = resource.apply("resnet-a",
                new ByteArrayInputStream(doc.toString().getBytes(StandardCharsets.UTF_8)));
        assertEquals(400, r.getStatus());
        assertEquals("jobs[0].aggregators[0].switch: unknown device 'not a uri'",
                body(r).get("message").asText());
        assertEquals(404, resource.show("resnet-a").getStatus());
    }

    @Test
    public void nothingIsWrittenForARefusedDocument() {
        post("resnet-a", "unknown-device.json");
        assertEquals(404, resource.show("resnet-a").getStatus());
    }
}
