package org.innetagg.onos.web;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.innetagg.onos.TestStorage;
import org.innetagg.onos.aggregation.JobNumberRegistry;
import org.innetagg.onos.aggregation.TestTopology;
import org.innetagg.onos.priority.TestTrafficClasses;
import org.innetagg.onos.priority.TrafficClassService;
import org.junit.Before;
import org.junit.Test;

import javax.ws.rs.DELETE;
import javax.ws.rs.GET;
import javax.ws.rs.POST;
import javax.ws.rs.Path;
import javax.ws.rs.core.Response;
import java.io.ByteArrayInputStream;
import java.io.InputStream;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;

import static org.innetagg.onos.aggregation.JobNumberService.Holder.AGGREGATION;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNotNull;
import static org.junit.Assert.assertTrue;

/**
 * The traffic-class resource's answers (docs/onos-aggregation-api.md, "Traffic-class
 * resource"): statuses, bodies, and one document per 400 naming its field. Called directly,
 * like {@link AggregationWebResourceTest}.
 */
public class TrafficClassWebResourceTest {
    private JobNumberRegistry numbers;
    private TrafficClassService service;
    private TrafficClassWebResource resource;

    @Before
    public void setUp() {
        TestStorage storage = new TestStorage();
        numbers = TestTopology.numbers(storage);
        service = TestTrafficClasses.manager(new TestTopology.RecordingFlowRules(), numbers, storage);
        resource = new TrafficClassWebResource() {
            @Override
            @SuppressWarnings("unchecked")
            public <T> T get(Class<T> serviceClass) {
                assertEquals(TrafficClassService.class, serviceClass);
                return (T) service;
            }
        };
    }

    private Response post(String job, String body) {
        InputStream in = new ByteArrayInputStream(body.getBytes(StandardCharsets.UTF_8));
        return resource.apply(job, in);
    }

    private static JsonNode body(Response r) {
        return new ObjectMapper().valueToTree(r.getEntity());
    }

    private static JsonNode json(String text) throws Exception {
        return new ObjectMapper().readTree(text);
    }

    private void assertRefused(int status, String job, String doc, String field) {
        Response r = post(job, doc);
        assertEquals(doc, status, r.getStatus());
        JsonNode body = body(r);
        assertEquals(status, body.get("code").asInt());
        assertTrue(doc + " -> " + body, body.get("message").asText().startsWith(field + ": "));
        assertEquals(doc, 404, resource.show(job).getStatus());
    }

    private void assertBadRequest(String doc, String field) {
        assertRefused(400, "resnet-a", doc, field);
    }

    @Test
    public void createThenReplaceThenGetThenDelete() throws Exception {
        Response created = post("resnet-a",
                "{\"job_id\": \"resnet-a\", \"priority_class\": 5, \"switches\": [\"device:spine1\", \"device:leaf1\"]}");
        assertEquals(201, created.getStatus());
        assertEquals(json("{\"job_id\": \"resnet-a\", \"priority_class\": 5,"
                + " \"switches\": [\"device:spine1\", \"device:leaf1\"], \"p4_job_id\": 0}"), body(created));

        Response replaced = post("resnet-a", "{\"job_id\": \"resnet-a\", \"priority_class\": 2}");
        assertEquals(200, replaced.getStatus());
        JsonNode inForce = json("{\"job_id\": \"resnet-a\", \"priority_class\": 2,"
                + " \"switches\": [\"device:leaf1\", \"device:leaf2\", \"device:spine1\"], \"p4_job_id\": 0}");
        assertEquals(inForce, body(replaced));

        Response got = resource.show("resnet-a");
        assertEquals(200, got.getStatus());
        assertEquals(inForce, body(got));

        assertEquals(204, resource.remove("resnet-a").getStatus());
        Response gone = resource.show("resnet-a");
        assertEquals(404, gone.getStatus());
        assertEquals(404, body(gone).get("code").asInt());
        assertTrue(body(gone).toString(), body(gone).get("message").asText().startsWith("job: "));
        assertEquals(204, resource.remove("resnet-a").getStatus());
        assertEquals(204, resource.remove("never-posted").getStatus());
    }

    @Test
    public void theSecondJobGetsTheNextNumber() {
        assertEquals(0, body(post("a", "{\"job_id\": \"a\", \"priority_class\": 1}")).get("p4_job_id").asInt());
        assertEquals(1, body(post("b", "{\"job_id\": \"b\", \"priority_class\": 1}")).get("p4_job_id").asInt());
    }

    @Test
    public void priorityClassNotAnIntegerIn0To7() {
        for (String cls : new String[] {"8", "-1", "\"3\"", "2.5", "true", "null", "99999999999999999999"}) {
            assertBadRequest("{\"job_id\": \"resnet-a\", \"priority_class\": " + cls + "}", "priority_class");
        }
        assertBadRequest("{\"job_id\": \"resnet-a\"}", "priority_class");
    }

    @Test
    public void jobIdNotThePathJob() {
        assertBadRequest("{\"job_id\": \"bert-b\", \"priority_class\": 1}", "job_id");
        assertBadRequest("{\"priority_class\": 1}", "job_id");
        assertBadRequest("{\"job_id\": 7, \"priority_class\": 1}", "job_id");
    }

    @Test
    public void unknownSwitch() {
        assertBadRequest("{\"job_id\": \"resnet-a\", \"priority_class\": 1,"
                + " \"switches\": [\"device:leaf1\", \"device:nowhere\"]}", "switches[1]");
    }

    @Test
    public void switchNotRunningOurPipeconf() {
        assertBadRequest("{\"job_id\": \"resnet-a\", \"priority_class\": 1, \"switches\": [\"device:ovs1\"]}",
                "switches[0]");
    }

    @Test
    public void sameSwitchTwice() {
        assertBadRequest("{\"job_id\": \"resnet-a\", \"priority_class\": 1,"
                + " \"switches\": [\"device:leaf1\", \"device:leaf2\", \"device:leaf1\"]}", "switches[2]");
    }

    @Test
    public void switchesNotAListOfIds() {
        assertBadRequest("{\"job_id\": \"resnet-a\", \"priority_class\": 1, \"switches\": \"device:leaf1\"}",
                "switches");
        assertBadRequest("{\"job_id\": \"resnet-a\", \"priority_class\": 1, \"switches\": [1]}", "switches[0]");
    }

    @Test
    public void bodyNotAJsonObject() {
        assertBadRequest("{\"job_id\": ", "body");
        assertBadRequest("[{\"job_id\": \"resnet-a\", \"priority_class\": 1}]", "body");
        assertBadRequest("3", "body");
        assertBadRequest("", "body");
    }

    @Test
    public void badJobIdInPath() {
        assertRefused(400, "../etc", "{\"job_id\": \"../etc\", \"priority_class\": 1}", "job");
    }

    @Test
    public void unavailableSwitchIs503() {
        assertRefused(503, "resnet-a",
                "{\"job_id\": \"resnet-a\", \"priority_class\": 1, \"switches\": [\"device:leaf3\"]}", "switches[0]");
    }

    @Test
    public void allJobNumbersInUseIs503() throws Exception {
        for (int n = 0; n < JobNumberRegistry.JOB_NUMBERS; n++) {
            numbers.acquire("placed-" + n, AGGREGATION);
        }
        assertRefused(503, "resnet-a", "{\"job_id\": \"resnet-a\", \"priority_class\": 1}", "job");
        // A job whose placement holds a number gets its class with it.
        Response r = post("placed-9", "{\"job_id\": \"placed-9\", \"priority_class\": 1}");
        assertEquals(201, r.getStatus());
        assertEquals(9, body(r).get("p4_job_id").asInt());
    }

    @Test
    public void aRefusedReplacementKeepsTheClassInForce() throws Exception {
        assertEquals(201, post("resnet-a", "{\"job_id\": \"resnet-a\", \"priority_class\": 4}").getStatus());
        assertEquals(400, post("resnet-a", "{\"job_id\": \"resnet-a\", \"priority_class\": 9}").getStatus());
        assertEquals(4, body(resource.show("resnet-a")).get("priority_class").asInt());
    }

    @Test
    public void servedUnderPriorityJobInTheAppsWebContext() throws Exception {
        assertTrue(new AggregationWebApplication().getClasses().contains(TrafficClassWebResource.class));
        assertEquals("priority", TrafficClassWebResource.class.getAnnotation(Path.class).value());
        Method post = TrafficClassWebResource.class.getMethod("apply", String.class, InputStream.class);
        Method get = TrafficClassWebResource.class.getMethod("show", String.class);
        Method delete = TrafficClassWebResource.class.getMethod("remove", String.class);
        assertNotNull(post.getAnnotation(POST.class));
        assertNotNull(get.getAnnotation(GET.class));
        assertNotNull(delete.getAnnotation(DELETE.class));
        for (Method m : new Method[] {post, get, delete}) {
            assertEquals("{job}", m.getAnnotation(Path.class).value());
        }
    }
}
