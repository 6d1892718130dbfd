package org.innetagg.onos.ui;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.junit.Before;
import org.junit.Test;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.stream.Collectors;

import static org.innetagg.onos.ui.AggregationTopoMessageHandler.CLEAR;
import static org.innetagg.onos.ui.AggregationTopoMessageHandler.ERROR;
import static org.innetagg.onos.ui.AggregationTopoMessageHandler.JOB;
import static org.innetagg.onos.ui.AggregationTopoMessageHandler.NEXT;
import static org.innetagg.onos.ui.AggregationTopoMessageHandler.PREV;
import static org.innetagg.onos.ui.AggregationTopoMessageHandler.REFRESH;
import static org.innetagg.onos.ui.AggregationTopoMessageHandler.SELECT;
import static org.innetagg.onos.ui.AggregationTopoMessageHandler.SHOW;
import static org.innetagg.onos.ui.AggregationTopoMessageHandler.START;
import static org.innetagg.onos.ui.AggregationTopoMessageHandler.STOP;
import static org.innetagg.onos.ui.UiTestTopology.fixture;
import static org.innetagg.onos.ui.UiTestTopology.validAs;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNotNull;
import static org.junit.Assert.assertTrue;

/**
 * The overlay's message handler, checked through the JSON it sends to the browser, on
 * {@link UiTestTopology}. No ONOS GUI runs here: the connection only records the messages.
 */
public class AggregationTopoMessageHandlerTest {
    private static final ObjectMapper MAPPER = new ObjectMapper();
    private static final String SHOW_HIGHLIGHTS = "showHighlights";

    // The link ids the topology view draws (host links host-first, see JobLinkMap).
    private static final String H1_LEAF1 = "00:00:00:00:00:01/None/0-device:leaf1/1";
    private static final String H2_LEAF1 = "00:00:00:00:00:02/None/0-device:leaf1/4";
    private static final String H3_LEAF2 = "00:00:00:00:00:03/None/0-device:leaf2/2";
    private static final String H4_LEAF2 = "00:00:00:00:00:04/None/0-device:leaf2/1";
    private static final String H5_LEAF2 = "FE:00:00:00:00:05/None/0-device:leaf2/6";
    private static final String LEAF1_SPINE1 = "device:leaf1/2-device:spine1/1";
    private static final String LEAF2_SPINE1 = "device:leaf2/3-device:spine1/2";

    private UiTestTopology.Placements placements;
    private UiTestTopology.ShortestPaths paths;
    private UiTestTopology.Browser browser;
    private AggregationTopoMessageHandler handler;

    @Before
    public void setUp() throws Exception {
        placements = new UiTestTopology.Placements();
        placements.put(fixture("resnet-a", "valid.json"));
        placements.put(fixture("bert-b", "ui/unpinned.json"));
        paths = new UiTestTopology.ShortestPaths();
        browser = new UiTestTopology.Browser();
        handler = new AggregationTopoMessageHandler();
        handler.init(browser, UiTestTopology.directory(placements, paths));
    }

    // --- what a job looks like

    @Test
    public void pinnedPathsAreDrawnAsPlacedAndOtherWorkersOnAShortestPath() {
        request(SELECT, "resnet-a");
        Highlights hl = lastHighlights();
        // Aggregators, badge = fan-in; nothing else carries a device badge.
        assertEquals(Map.of("device:leaf1", "2", "device:leaf2", "2"), hl.deviceBadges);
        // spine1 is crossed (pinned path and the shortest path chosen for h2); spine2 is not.
        assertEquals(Set.of("device:leaf1", "device:leaf2", "device:spine1"), hl.devices);
        assertEquals(Map.of("00:00:00:00:00:01/None", "W", "00:00:00:00:00:02/None", "W",
                            "00:00:00:00:00:03/None", "W", "00:00:00:00:00:04/None", "PS"), hl.hostBadges);
        assertEquals(Set.of(H1_LEAF1, H2_LEAF1, H3_LEAF2, H4_LEAF2, LEAF1_SPINE1, LEAF2_SPINE1), hl.links);
        assertEquals("min", hl.subdue);
        assertTrue(hl.linkCss.values().stream().allMatch("primary"::equals));
    }

    @Test
    public void withoutPinnedPathsEveryHopIsRoutedByOnos() {
        request(SELECT, "bert-b");
        Highlights hl = lastHighlights();
        assertEquals(Map.of("device:leaf2", "2"), hl.deviceBadges);
        assertEquals(Map.of("00:00:00:00:00:01/None", "W", "FE:00:00:00:00:05/None", "W",
                            "00:00:00:00:00:03/None", "PS"), hl.hostBadges);
        // h1 -> leaf2 (via spine1, the first of the two equal paths), h5 -> leaf2, leaf2 -> h3.
        assertEquals(Set.of(H1_LEAF1, LEAF1_SPINE1, LEAF2_SPINE1, H5_LEAF2, H3_LEAF2), hl.links);
        assertEquals(Set.of("device:leaf1", "device:leaf2", "device:spine1"), hl.devices);
        assertTrue(paths.calls > 0);
    }

    @Test
    public void theSameEqualCostPathIsChosenEveryTime() {
        for (int i = 0; i < 5; i++) {
            request(SELECT, "bert-b");
            assertFalse(lastHighlights().links.stream().anyMatch(l -> l.contains("spine2")));
        }
    }

    @Test
    public void panelSummarisesTheJob() {
        request(SELECT, "resnet-a");
        JsonNode job = last(JOB);
        assertEquals("resnet-a", job.get("job").asText());
        assertEquals(List.of("bert-b", "resnet-a"), texts(job.get("jobs")));
        Map<String, String> props = props(job.get("panel"));
        assertEquals("resnet-a", job.get("panel").get("title").asText());
        assertEquals(String.valueOf(placements.jobs.get("resnet-a").p4JobId), props.get("P4 job id"));
        assertEquals("3", props.get("Workers"));
        assertEquals("00:00:00:00:00:04/None", props.get("Parameter server"));
        assertEquals("2", props.get("Aggregators"));
        assertEquals("1 pinned, 2 by ONOS's shortest path", props.get("Paths"));
        assertEquals("fan-in 2, slots [0, 128) → device:leaf2", props.get("device:leaf1"));
        assertEquals("fan-in 2, slots [128, 192) → 00:00:00:00:00:04/None", props.get("device:leaf2"));
        assertFalse(props.containsKey("Not shown"));
    }

    @Test
    public void whatOnosDoesNotKnowIsListedNotDrawn() throws Exception {
        placements.put(fixture("gpt-c", "ui/not-in-onos.json"));
        request(SELECT, "gpt-c");
        Highlights hl = lastHighlights();
        assertEquals(Map.of("device:leaf1", "1"), hl.deviceBadges);
        // The pinned hop leaf1 -> leaf2 has no link: nothing is drawn between them, no detour guessed.
        assertEquals(Set.of(H1_LEAF1, H4_LEAF2), hl.links);
        assertEquals(Map.of("00:00:00:00:00:01/None", "W", "00:00:00:00:00:04/None", "PS"), hl.hostBadges);
        List<String> notShown = notShown(last(JOB).get("panel"));
        assertEquals(List.of("aggregator device:leaf9: unknown to ONOS", "worker h0_0_0: unknown to ONOS",
                             "hop device:leaf1 → device:leaf2: no link in ONOS"), notShown);
    }

    @Test
    public void anAggregationLoopIsReportedNotFollowedForever() throws Exception {
        placements.put(fixture("loop-d", "ui/loop.json"));
        request(SELECT, "loop-d");
        assertEquals(List.of("next_hop loop: device:leaf1 → device:leaf2 → device:leaf1"),
                     notShown(last(JOB).get("panel")));
        assertEquals(Map.of("device:leaf1", "1", "device:leaf2", "1"), lastHighlights().deviceBadges);
    }

    // --- selection

    @Test
    public void startShowsTheFirstJobInIdOrder() {
        request(START, null);
        assertEquals(Map.of("device:leaf2", "2"), lastHighlights().deviceBadges);
        assertEquals("bert-b", last(JOB).get("job").asText());
    }

    @Test
    public void startWithNoJobsShowsNothingAndSaysSo() {
        placements.jobs.clear();
        request(START, null);
        assertTrue(lastHighlights().isEmpty());
        assertTrue(last(JOB).get("job").isNull());
        assertEquals(0, last(JOB).get("jobs").size());
        request(SHOW, null);
        assertEquals("no jobs are placed", last(JOB).get("message").asText());
    }

    @Test
    public void clearAndStopGiveEmptyHighlights() {
        request(SELECT, "resnet-a");
        assertFalse(lastHighlights().isEmpty());
        request(CLEAR, null);
        assertTrue(lastHighlights().isEmpty());
        assertTrue(lastHighlights().subdue == null);
        assertTrue(last(JOB).get("job").isNull());
        assertTrue(last(JOB).get("panel").isNull());

        request(SELECT, "bert-b");
        request(STOP, null);
        assertTrue(lastHighlights().isEmpty());
        // stopped: a later refresh has nothing to show
        browser.sent.clear();
        request(REFRESH, null);
        assertEquals(List.of(), browser.sent);
    }

    @Test
    public void unknownJobIsAnErrorMessageAndKeepsTheSelection() {
        request(SELECT, "resnet-a");
        browser.sent.clear();
        request(SELECT, "no-such-job");
        assertEquals(1, browser.sent.size());
        assertEquals("no placement for job 'no-such-job'", last(ERROR).get("message").asText());
        request(SHOW, null);
        assertEquals("resnet-a", last(JOB).get("job").asText());
    }

    @Test
    public void selectWithoutJobIdIsAnErrorMessage() {
        handler.process(message(SELECT, MAPPER.createObjectNode()));
        assertEquals("select: a job id expected", last(ERROR).get("message").asText());
    }

    @Test
    public void nextAndPreviousCycleOverJobsInIdOrder() throws Exception {
        placements.jobs.clear();
        placements.put(validAs("c"));
        placements.put(validAs("a"));
        placements.put(validAs("b"));
        List<String> seen = new ArrayList<>();
        for (int i = 0; i < 4; i++) {
            request(NEXT, null);
            seen.add(last(JOB).get("job").asText());
        }
        assertEquals(List.of("a", "b", "c", "a"), seen);
        seen.clear();
        for (int i = 0; i < 3; i++) {
            request(PREV, null);
            seen.add(last(JOB).get("job").asText());
        }
        assertEquals(List.of("c", "b", "a"), seen);
        request(CLEAR, null);
        request(PREV, null);
        assertEquals("c", last(JOB).get("job").asText());
    }

    @Test
    public void nextAndPreviousStepFromAJobThatWasRemoved() throws Exception {
        placements.jobs.clear();
        placements.put(validAs("a"));
        placements.put(validAs("b"));
        placements.put(validAs("c"));
        request(SELECT, "b");
        placements.remove("b");
        request(NEXT, null);
        assertEquals("c", last(JOB).get("job").asText());
        request(SELECT, "b2");  // unknown: error, stays on c
        placements.put(validAs("b"));
        request(SELECT, "b");
        placements.remove("b");
        request(PREV, null);
        assertEquals("a", last(JOB).get("job").asText());
    }

    @Test
    public void nextWithNoJobsIsAnErrorMessage() {
        placements.jobs.clear();
        request(NEXT, null);
        assertEquals("no jobs are placed", last(ERROR).get("message").asText());
        assertTrue(lastHighlights().isEmpty());
    }

    // --- refresh

    @Test
    public void refreshSendsOnlyWhatChanged() throws Exception {
        request(SELECT, "resnet-a");
        browser.sent.clear();
        request(REFRESH, null);
        assertEquals(List.of(), browser.sent);

        // The job is re-placed without leaf1: its highlights and panel follow.
        placements.put(fixture("resnet-a", "replaced.json"));
        request(REFRESH, null);
        assertEquals(Map.of("device:leaf2", "2"), lastHighlights().deviceBadges);
        assertEquals("1", props(last(JOB).get("panel")).get("Aggregators"));
        browser.sent.clear();

        // Another job appears: the list changes, the highlights do not.
        placements.put(validAs("zz"));
        request(REFRESH, null);
        assertEquals(List.of(JOB), events());
        assertEquals(List.of("bert-b", "resnet-a", "zz"), texts(last(JOB).get("jobs")));
        browser.sent.clear();

        // The job is deleted: highlights cleared, said once.
        placements.remove("resnet-a");
        request(REFRESH, null);
        assertTrue(lastHighlights().isEmpty());
        assertEquals("job 'resnet-a' is no longer placed", last(JOB).get("message").asText());
        browser.sent.clear();
        request(REFRESH, null);
        assertEquals(List.of(), browser.sent);
    }

    @Test
    public void aFailingServiceGivesAnErrorMessageNotAnException() {
        placements.failure = new IllegalStateException("store unavailable");
        request(SELECT, "resnet-a");
        request(NEXT, null);
        request(REFRESH, null);
        List<String> errors = browser.sent.stream().filter(m -> m.get("event").asText().equals(ERROR))
                .map(m -> m.get("payload").get("message").asText()).collect(Collectors.toList());
        assertEquals(List.of("innetAggSelect failed: store unavailable", "innetAggNext failed: store unavailable",
                             "innetAggRefresh failed: store unavailable"), errors);
    }

    @Test
    public void handlesExactlyTheOverlayRequests() {
        assertEquals(Set.of(START, STOP, SHOW, SELECT, NEXT, PREV, CLEAR, REFRESH), handler.messageTypes());
    }

    // --- helpers

    private void request(String event, String job) {
        ObjectNode payload = MAPPER.createObjectNode();
        if (job != null) {
            payload.put("job", job);
        }
        handler.process(message(event, payload));
    }

    private static ObjectNode message(String event, ObjectNode payload) {
        ObjectNode m = MAPPER.createObjectNode().put("event", event);
        m.set("payload", payload);
        return m;
    }

    private List<String> events() {
        return browser.sent.stream().map(m -> m.get("event").asText()).collect(Collectors.toList());
    }

    private JsonNode last(String event) {
        for (int i = browser.sent.size() - 1; i >= 0; i--) {
            if (browser.sent.get(i).get("event").asText().equals(event)) {
                return browser.sent.get(i).get("payload");
            }
        }
        throw new AssertionError("no " + event + " sent; sent: " + events());
    }

    private Highlights lastHighlights() {
        return new Highlights(last(SHOW_HIGHLIGHTS));
    }

    private static List<String> texts(JsonNode array) {
        List<String> out = new ArrayList<>();
        array.forEach(n -> out.add(n.asText()));
        return out;
    }

    /** label -> value of a PropertyPanel as TopoJson encodes it. */
    private static Map<String, String> props(JsonNode panel) {
        assertNotNull(panel);
        Map<String, String> out = new HashMap<>();
        for (JsonNode key : panel.get("propOrder")) {
            if (!key.asText().equals("-")) {
                out.put(panel.get("propLabels").get(key.asText()).asText(),
                        panel.get("propValues").get(key.asText()).asText());
            }
        }
        return out;
    }

    private static List<String> notShown(JsonNode panel) {
        List<String> out = new ArrayList<>();
        for (JsonNode key : panel.get("propOrder")) {
            if (panel.get("propLabels").path(key.asText()).asText().equals("Not shown")) {
                out.add(panel.get("propValues").get(key.asText()).asText());
            }
        }
        return out;
    }

    /** The showHighlights payload, decoded. */
    private static final class Highlights {
        final Set<String> devices = new TreeSet<>();
        final Map<String, String> deviceBadges = new HashMap<>();
        final Map<String, String> hostBadges = new HashMap<>();
        final Set<String> links = new TreeSet<>();
        final Map<String, String> linkCss = new HashMap<>();
        final String subdue;

        Highlights(JsonNode p) {
            for (JsonNode d : p.get("devices")) {
                devices.add(d.get("id").asText());
                if (d.has("badge")) {
                    deviceBadges.put(d.get("id").asText(), d.get("badge").get("txt").asText());
                }
            }
            for (JsonNode h : p.get("hosts")) {
                hostBadges.put(h.get("id").asText(), h.path("badge").path("txt").asText());
            }
            for (JsonNode l : p.get("links")) {
                links.add(l.get("id").asText());
                linkCss.put(l.get("id").asText(), l.get("css").asText());
            }
            subdue = p.has("subdue") ? p.get("subdue").asText() : null;
        }

        boolean isEmpty() {
            return devices.isEmpty() && hostBadges.isEmpty() && links.isEmpty();
        }
    }
}
