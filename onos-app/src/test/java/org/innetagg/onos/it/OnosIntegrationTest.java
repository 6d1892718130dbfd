package org.innetagg.onos.it;

import org.junit.Assume;
import org.junit.Before;
import org.junit.Test;

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Base64;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;

/**
 * Installs the built .oar into a running ONOS 2.7 and checks that the app activates and its
 * resource answers. Needs ONOS_URL (e.g. http://127.0.0.1:8181, user onos/rocks or
 * ONOS_USER/ONOS_PASSWORD) and the .oar (mvn package before mvn verify/test with ONOS_URL).
 * Skipped otherwise. `make test` runs it against the ONOS 2.7.0 built from source, where that
 * exists (tests/onos/test_app.py; onos-app/README.md).
 */
public class OnosIntegrationTest {
    private static final String APP = "org.innetagg.app";
    private String base;
    private String auth;
    private final HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(5)).build();

    @Before
    public void needsOnos() {
        base = System.getenv("ONOS_URL");
        Assume.assumeTrue("ONOS_URL not set: no ONOS 2.7 to install the .oar into (tests/onos runs this"
                + " against a real ONOS where one is built); see onos-app/README.md", base != null && !base.isEmpty());
        String user = System.getenv().getOrDefault("ONOS_USER", "onos");
        String password = System.getenv().getOrDefault("ONOS_PASSWORD", "rocks");
        auth = "Basic " + Base64.getEncoder().encodeToString((user + ":" + password)
                .getBytes(StandardCharsets.UTF_8));
    }

    private HttpResponse<String> send(HttpRequest.Builder req) throws Exception {
        return http.send(req.header("Authorization", auth).timeout(Duration.ofSeconds(60)).build(),
                HttpResponse.BodyHandlers.ofString());
    }

    @Test
    public void appInstallsActivatesAndAnswers() throws Exception {
        Path oar;
        try (var files = Files.list(Path.of("target"))) {
            oar = files.filter(p -> p.toString().endsWith(".oar")).findFirst()
                    .orElseThrow(() -> new AssertionError("no .oar in target/: run mvn package first"));
        }
        send(HttpRequest.newBuilder(URI.create(base + "/onos/v1/applications/" + APP)).DELETE());
        HttpResponse<String> installed = send(HttpRequest.newBuilder(
                URI.create(base + "/onos/v1/applications?activate=true"))
                .header("Content-Type", "application/octet-stream")
                .POST(HttpRequest.BodyPublishers.ofFile(oar)));
        assertTrue(installed.body(), installed.statusCode() < 300);
        String state = "";
        for (int i = 0; i < 60 && !state.contains("ACTIVE"); i++) {
            state = send(HttpRequest.newBuilder(URI.create(base + "/onos/v1/applications/" + APP)).GET()).body();
            Thread.sleep(1000);
        }
        assertTrue(state, state.contains("\"state\":\"ACTIVE\""));
        // ONOS says ACTIVE before pax-web has started the bundle's web context; until then
        // Jetty answers its own HTML 404.
        HttpResponse<String> absent = null;
        for (int i = 0; i < 60; i++) {
            absent = send(HttpRequest.newBuilder(
                    URI.create(base + "/onos/innet-agg/aggregation/it-absent")).GET());
            if (absent.headers().firstValue("Content-Type").orElse("").startsWith("application/json")) {
                break;
            }
            Thread.sleep(500);
        }
        // Our resource's 404 carries our message; a missing web context would not.
        assertEquals(404, absent.statusCode());
        assertTrue(absent.body(), absent.body().contains("no placement for 'it-absent'"));
        HttpResponse<String> bad = send(HttpRequest.newBuilder(
                URI.create(base + "/onos/innet-agg/aggregation/it-job"))
                .header("Content-Type", "application/json")
                .POST(HttpRequest.BodyPublishers.ofString("{\"jobs\": []}")));
        assertEquals(400, bad.statusCode());
    }

    /**
     * A placement becomes agg_job flow rules in ONOS's flow store (devices of ONOS's null
     * provider, {@code org.onosproject.null} with a topology: rules stay pending there, having no
     * switch behind them, but ONOS lists them), and DELETE takes them away. Skipped when the ONOS
     * has no host (null provider not active).
     */
    @Test
    public void aPlacementBecomesFlowRulesAndDeleteRemovesThem() throws Exception {
        appInstallsActivatesAndAnswers();
        com.fasterxml.jackson.databind.ObjectMapper json = new com.fasterxml.jackson.databind.ObjectMapper();
        com.fasterxml.jackson.databind.JsonNode hosts = json.readTree(send(HttpRequest.newBuilder(
                URI.create(base + "/onos/v1/hosts")).GET()).body()).path("hosts");
        Assume.assumeTrue("ONOS has no hosts: activate org.onosproject.null with a topology", hosts.size() > 0);
        com.fasterxml.jackson.databind.JsonNode ps = hosts.get(0);
        String device = ps.path("locations").get(0).path("elementId").asText();
        String doc = "{\"jobs\": [{\"job_id\": \"it-place\", \"aggregators\": [{\"switch\": \"" + device
                + "\", \"children\": [], \"fan_in\": 2, \"next_hop\": \"" + ps.path("id").asText()
                + "\", \"pool\": {\"base\": 0, \"size\": 64}}], \"worker_paths\": {}}]}";
        URI job = URI.create(base + "/onos/innet-agg/aggregation/it-place");
        try {
            HttpResponse<String> applied = send(HttpRequest.newBuilder(job)
                    .header("Content-Type", "application/json").POST(HttpRequest.BodyPublishers.ofString(doc)));
            assertTrue(applied.body(), applied.statusCode() == 201 || applied.statusCode() == 200);
            // FlowRuleService.applyFlowRules hands the batch to an executor and returns: the
            // rules reach the flow store after the 201, so they are awaited, not read once.
            int placed = awaitAggJobRules(json, device, n -> n > 0);
            assertTrue("no agg_job rule on " + device + " 15 s after the placement", placed > 0);
        } finally {
            // A failed run must not leave its job behind for the next one.
            assertEquals(204, send(HttpRequest.newBuilder(job).DELETE()).statusCode());
        }
        assertEquals(0, awaitAggJobRules(json, device, n -> n == 0));
    }

    /** Polls the device's agg_job rules for up to 15 s until {@code done} holds; the last count. */
    private int awaitAggJobRules(com.fasterxml.jackson.databind.ObjectMapper json, String device,
                                 java.util.function.IntPredicate done) throws Exception {
        int n = aggJobRules(json, device);
        for (int i = 0; i < 30 && !done.test(n); i++) {
            Thread.sleep(500);
            n = aggJobRules(json, device);
        }
        return n;
    }

    private int aggJobRules(com.fasterxml.jackson.databind.ObjectMapper json, String device) throws Exception {
        com.fasterxml.jackson.databind.JsonNode flows = json.readTree(send(HttpRequest.newBuilder(
                URI.create(base + "/onos/v1/flows/" + device)).GET()).body()).path("flows");
        int n = 0;
        for (com.fasterxml.jackson.databind.JsonNode f : flows) {
            if (APP.equals(f.path("appId").asText())
                    // ONOS 2.7's FlowRuleCodec: tableId is the table's number, tableName the
                    // PI table id (IngressPipe.aggregation.agg_job) for PI tables.
                    && f.path("tableName").asText().endsWith(".agg_job")
                    && !"PENDING_REMOVE".equals(f.path("state").asText())) {
                n++;
            }
        }
        return n;
    }
}
