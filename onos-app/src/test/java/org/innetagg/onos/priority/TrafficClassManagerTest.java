package org.innetagg.onos.priority;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.innetagg.onos.TestStorage;
import org.innetagg.onos.aggregation.AggregationManager;
import org.innetagg.onos.aggregation.AppliedPlacement;
import org.innetagg.onos.aggregation.InvalidPlacementException;
import org.innetagg.onos.aggregation.JobNumberRegistry;
import org.innetagg.onos.aggregation.JobPlacement;
import org.innetagg.onos.aggregation.TestTopology;
import org.innetagg.onos.pipeconf.PipeconfLoader;
import org.innetagg.onos.pipeconf.PipelineModelCheck;
import org.junit.Before;
import org.junit.BeforeClass;
import org.junit.Test;
import org.onosproject.net.DeviceId;
import org.onosproject.net.flow.FlowRule;
import org.onosproject.net.flow.criteria.PiCriterion;
import org.onosproject.net.pi.model.PiMatchFieldId;
import org.onosproject.net.pi.model.PiPipelineModel;
import org.onosproject.net.pi.runtime.PiAction;
import org.onosproject.net.pi.runtime.PiExactFieldMatch;
import org.onosproject.net.pi.runtime.PiFieldMatch;
import org.onosproject.net.pi.runtime.PiTernaryFieldMatch;

import java.io.InputStream;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.stream.Collectors;

import static org.innetagg.onos.aggregation.JobNumberService.Holder.AGGREGATION;
import static org.innetagg.onos.aggregation.TestTopology.APP;
import static org.innetagg.onos.aggregation.TestTopology.LEAF1;
import static org.innetagg.onos.aggregation.TestTopology.LEAF2;
import static org.innetagg.onos.aggregation.TestTopology.SPINE1;
import static org.innetagg.onos.pipeconf.P4InfoConstants.AGG_JOB_ID;
import static org.innetagg.onos.pipeconf.P4InfoConstants.CLASS;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_AGGREGATION_AGG_JOB;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_TRAFFIC_CLASS_SET_CLASS;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_TRAFFIC_CLASS_TRAFFIC_CLASS;
import static org.innetagg.onos.pipeconf.P4InfoConstants.IS_AGG;
import static org.innetagg.onos.pipeconf.P4InfoConstants.JOB_ID;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

/**
 * A job's class -> traffic_class entries, through ONOS's service adapters on
 * {@link TestTopology}; every entry checked against the pipeline model ONOS builds from our
 * P4Info; job numbers shared with an {@link AggregationManager}.
 */
public class TrafficClassManagerTest {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static PiPipelineModel model;

    private TestTopology.RecordingFlowRules rules;
    private JobNumberRegistry numbers;
    private TrafficClassManager classes;
    private AggregationManager aggregation;

    @BeforeClass
    public static void parseP4Info() throws Exception {
        // The copy the bundle carries: the committed P4Info minus fields ONOS 2.7 cannot parse.
        model = PipeconfLoader.pipelineModel(Path.of(System.getProperty("innetagg.onos.p4info")).toUri().toURL());
    }

    @Before
    public void setUp() {
        rules = new TestTopology.RecordingFlowRules();
        TestStorage storage = new TestStorage();
        numbers = TestTopology.numbers(storage);
        classes = TestTrafficClasses.manager(rules, numbers, storage);
        aggregation = TestTopology.manager(rules, numbers, storage);
    }

    static JobClass jobClass(String job, int cls, String... switches) throws Exception {
        String list = switches.length == 0 ? ""
                : ", \"switches\": [" + List.of(switches).stream().map(s -> "\"" + s + "\"")
                .collect(Collectors.joining(", ")) + "]";
        return JobClass.decode(job, JSON.readTree(
                "{\"job_id\": \"" + job + "\", \"priority_class\": " + cls + list + "}"));
    }

    private static JobPlacement placement(String job, int shift) throws Exception {
        try (InputStream in = TrafficClassManagerTest.class.getResourceAsStream("/placements/valid.json")) {
            ObjectNode doc = (ObjectNode) JSON.readTree(in);
            ObjectNode j = (ObjectNode) doc.get("jobs").get(0);
            j.put("job_id", job);
            for (JsonNode agg : j.get("aggregators")) {
                ObjectNode pool = (ObjectNode) agg.get("pool");
                pool.put("base", pool.get("base").asInt() + shift);
            }
            return JobPlacement.decode(job, doc);
        }
    }

    private List<FlowRule> classEntries() {
        return rules.installed(INGRESS_PIPE_TRAFFIC_CLASS_TRAFFIC_CLASS);
    }

    private Map<DeviceId, FlowRule> classEntriesByDevice() {
        return classEntries().stream().collect(Collectors.toMap(FlowRule::deviceId, r -> r));
    }

    /**
     * Checks one traffic_class entry against the pipeline model and the contract; returns its
     * class.
     */
    private static long assertClassEntry(FlowRule rule, int p4JobId) {
        PiAction action = PipelineModelCheck.assertFits(rule, model);
        assertEquals(INGRESS_PIPE_TRAFFIC_CLASS_TRAFFIC_CLASS, rule.table());
        assertEquals(INGRESS_PIPE_TRAFFIC_CLASS_SET_CLASS, action.id());
        assertEquals(100, rule.priority());
        assertEquals(APP.id(), rule.appId());
        assertTrue(rule.isPermanent());
        PiCriterion match = (PiCriterion) rule.selector().criteria().iterator().next();
        Map<PiMatchFieldId, PiFieldMatch> fields = match.fieldMatches().stream()
                .collect(Collectors.toMap(PiFieldMatch::fieldId, m -> m));
        // is_agg and agg_job_id only: dscp, addresses, protocol and ports are wildcards.
        assertEquals(Set.of(IS_AGG, AGG_JOB_ID), fields.keySet());
        PiTernaryFieldMatch isAgg = (PiTernaryFieldMatch) fields.get(IS_AGG);
        assertEquals(1, unsigned(isAgg.value().asArray()));
        assertEquals(1, unsigned(isAgg.mask().asArray()));
        PiTernaryFieldMatch job = (PiTernaryFieldMatch) fields.get(AGG_JOB_ID);
        assertEquals(p4JobId, unsigned(job.value().asArray()));
        assertEquals(0xffff, unsigned(job.mask().asArray()));
        return PipelineModelCheck.param(action, CLASS);
    }

    private static long unsigned(byte[] bytes) {
        long v = 0;
        for (byte b : bytes) {
            v = (v << 8) | (b & 0xff);
        }
        return v;
    }

    private static void assertRefused(int status, String field, ThrowingRunnable call) {
        try {
            call.run();
            fail("accepted; expected " + status + " naming " + field);
        } catch (InvalidPlacementException e) {
            assertEquals(e.getMessage(), status, e.status());
            assertTrue(e.getMessage(), e.getMessage().startsWith(field + ": "));
        } catch (Exception e) {
            throw new AssertionError(e);
        }
    }

    interface ThrowingRunnable {
        void run() throws Exception;
    }

    @Test
    public void oneEntryPerListedSwitchFittingThePipelineModel() throws Exception {
        AppliedClass applied = classes.apply(jobClass("resnet-a", 5, "device:leaf1", "device:spine1"));
        assertTrue(applied.created);
        assertEquals(0, applied.p4JobId);
        assertEquals(List.of(LEAF1, SPINE1), applied.switches);
        Map<DeviceId, FlowRule> byDevice = classEntriesByDevice();
        assertEquals(Set.of(LEAF1, SPINE1), byDevice.keySet());
        for (FlowRule r : byDevice.values()) {
            assertEquals(5, assertClassEntry(r, 0));
        }
        JsonNode doc = applied.document();
        assertEquals("resnet-a", doc.get("job_id").asText());
        assertEquals(5, doc.get("priority_class").asInt());
        assertEquals(JSON.readTree("[\"device:leaf1\", \"device:spine1\"]"), doc.get("switches"));
        assertEquals(0, doc.get("p4_job_id").asInt());
    }

    @Test
    public void everyClassFitsTheThreeBitParameter() throws Exception {
        for (int cls = 0; cls <= 7; cls++) {
            classes.apply(jobClass("job" + cls, cls, "device:leaf2"));
        }
        for (FlowRule r : classEntries()) {
            int job = (int) unsigned(((PiTernaryFieldMatch) ((PiCriterion) r.selector().criteria().iterator().next())
                    .fieldMatch(AGG_JOB_ID).orElseThrow()).value().asArray());
            assertEquals(job, assertClassEntry(r, job));
        }
        assertEquals(8, classEntries().size());
    }

    @Test
    public void defaultSwitchesAreTheAvailableDevicesRunningOurPipeconf() throws Exception {
        AppliedClass applied = classes.apply(jobClass("resnet-a", 7));
        // leaf3 is down, ovs1 runs another pipeline.
        assertEquals(List.of(LEAF1, LEAF2, SPINE1), applied.switches);
        assertEquals(Set.of(LEAF1, LEAF2, SPINE1), classEntriesByDevice().keySet());
        assertEquals(JSON.readTree("[\"device:leaf1\", \"device:leaf2\", \"device:spine1\"]"),
                applied.document().get("switches"));
        assertEquals(applied.document(), classes.get("resnet-a").orElseThrow().document());
    }

    @Test
    public void replacingRemovesTheEntriesOfSwitchesNoLongerListed() throws Exception {
        classes.apply(jobClass("resnet-a", 3));
        classes.apply(jobClass("bert-b", 1, "device:leaf1"));
        AppliedClass replaced = classes.apply(jobClass("resnet-a", 6, "device:leaf2"));
        assertFalse(replaced.created);
        assertEquals(0, replaced.p4JobId);
        // leaf1 and spine1 lose resnet-a's entry (bert-b's stays); leaf2's is rewritten, not removed.
        assertEquals(Set.of(LEAF1, SPINE1), rules.removed.stream().map(FlowRule::deviceId).collect(Collectors.toSet()));
        assertEquals(2, rules.removed.size());
        Map<Long, FlowRule> byJob = classEntries().stream().collect(Collectors.toMap(
                r -> unsigned(((PiTernaryFieldMatch) ((PiCriterion) r.selector().criteria().iterator().next())
                        .fieldMatch(AGG_JOB_ID).orElseThrow()).value().asArray()), r -> r));
        assertEquals(2, classEntries().size());
        assertEquals(LEAF2, byJob.get(0L).deviceId());
        assertEquals(6, assertClassEntry(byJob.get(0L), 0));
        assertEquals(LEAF1, byJob.get(1L).deviceId());
        assertEquals(1, assertClassEntry(byJob.get(1L), 1));
    }

    @Test
    public void reapplyingIsIdempotent() throws Exception {
        classes.apply(jobClass("resnet-a", 4, "device:leaf1", "device:leaf2"));
        AppliedClass again = classes.apply(jobClass("resnet-a", 4, "device:leaf1", "device:leaf2"));
        assertFalse(again.created);
        assertEquals(0, again.p4JobId);
        assertEquals(List.of(), rules.removed);
        assertEquals(2, classEntries().size());
    }

    @Test
    public void listedSwitchesAreCheckedAndNothingIsWrittenForARefusedDocument() throws Exception {
        assertRefused(400, "switches[1]", () -> classes.apply(jobClass("j", 1, "device:leaf1", "device:nope")));
        assertRefused(400, "switches[0]", () -> classes.apply(jobClass("j", 1, "device:ovs1")));
        assertRefused(400, "switches[0]", () -> classes.apply(jobClass("j", 1, "not a device id")));
        assertRefused(503, "switches[1]", () -> classes.apply(jobClass("j", 1, "device:leaf1", "device:leaf3")));
        // A document error first: retrying a 503 would not help it.
        assertRefused(400, "switches[1]", () -> classes.apply(jobClass("j", 1, "device:leaf3", "device:ovs1")));
        assertEquals(List.of(), rules.applied);
        assertEquals(Optional.empty(), classes.get("j"));
        assertEquals(Optional.empty(), numbers.number("j"));
    }

    @Test
    public void aRefusedReplacementLeavesTheClassInForce() throws Exception {
        classes.apply(jobClass("resnet-a", 2, "device:leaf1"));
        assertRefused(503, "switches[0]", () -> classes.apply(jobClass("resnet-a", 5, "device:leaf3")));
        assertEquals(2, classes.get("resnet-a").orElseThrow().jobClass.priorityClass);
        assertEquals(List.of(), rules.removed);
        assertEquals(2, assertClassEntry(classEntries().get(0), 0));
    }

    @Test
    public void aJobWithAPlacementKeepsItsNumberForItsClass() throws Exception {
        aggregation.apply(placement("resnet-a", 0));
        AppliedPlacement bert = aggregation.apply(placement("bert-b", 256));
        assertEquals(1, bert.p4JobId);
        AppliedClass cls = classes.apply(jobClass("bert-b", 6, "device:leaf1"));
        assertTrue(cls.created);
        assertEquals(1, cls.p4JobId);
        // The class entry matches the number bert-b's agg_job entries carry.
        Set<Long> aggJobIdsOnLeaf1 = rules.installed(INGRESS_PIPE_AGGREGATION_AGG_JOB).stream()
                .filter(r -> r.deviceId().equals(LEAF1))
                .map(r -> unsigned(((PiExactFieldMatch) ((PiCriterion) r.selector().criteria().iterator().next())
                        .fieldMatch(JOB_ID).orElseThrow()).value().asArray()))
                .collect(Collectors.toSet());
        assertEquals(Set.of(0L, 1L), aggJobIdsOnLeaf1);
        assertEquals(6, assertClassEntry(classEntriesByDevice().get(LEAF1), 1));
        // A PS-only job (no placement) gets the lowest free number.
        assertEquals(2, classes.apply(jobClass("ps-only", 0, "device:leaf2")).p4JobId);
    }

    @Test
    public void theNumberOutlivesThePlacementWhileTheClassHoldsItAndViceVersa() throws Exception {
        aggregation.apply(placement("zeta", 0));                           // 0
        assertEquals(1, classes.apply(jobClass("resnet-a", 3)).p4JobId);   // class first
        AppliedPlacement placed = aggregation.apply(placement("resnet-a", 256));
        assertTrue(placed.created);
        assertEquals(1, placed.p4JobId);
        assertEquals(1, placed.document().get("p4_job_id").asInt());

        assertTrue(classes.remove("resnet-a"));
        assertEquals(Optional.of(1), numbers.number("resnet-a"));
        assertEquals(2, aggregation.apply(placement("other", 512)).p4JobId);
        assertEquals(1, classes.apply(jobClass("resnet-a", 4, "device:leaf1")).p4JobId);

        assertTrue(aggregation.remove("resnet-a"));
        assertEquals(Optional.of(1), numbers.number("resnet-a"));
        assertEquals(1, aggregation.apply(placement("resnet-a", 256)).p4JobId);

        assertTrue(aggregation.remove("resnet-a"));
        assertTrue(classes.remove("resnet-a"));
        assertEquals(Optional.empty(), numbers.number("resnet-a"));
        assertEquals(1, classes.apply(jobClass("next", 0, "device:leaf1")).p4JobId);
    }

    @Test
    public void allJobNumbersInUseIs503() throws Exception {
        for (int n = 0; n < JobNumberRegistry.JOB_NUMBERS; n++) {
            numbers.acquire("j" + n, AGGREGATION);
        }
        try {
            classes.apply(jobClass("one-more", 1, "device:leaf1"));
            fail("a class for a job beyond the 256 numbers");
        } catch (InvalidPlacementException e) {
            assertEquals(503, e.status());
            assertEquals("job: all 256 job numbers are in use", e.getMessage());
        }
        assertEquals(List.of(), rules.applied);
        assertEquals(Optional.empty(), classes.get("one-more"));
        // A job that has a number still gets its class.
        assertEquals(255, classes.apply(jobClass("j255", 7, "device:leaf1")).p4JobId);
        assertEquals(7, assertClassEntry(classEntriesByDevice().get(LEAF1), 255));
    }

    @Test
    public void classesAreTheJobsInForceSortedById() throws Exception {
        classes.apply(jobClass("zeta", 1, "device:leaf1"));
        classes.apply(jobClass("alpha", 2, "device:leaf1"));
        assertEquals(List.of("alpha", "zeta"),
                classes.classes().stream().map(a -> a.jobClass.jobId).collect(Collectors.toList()));
    }

    @Test
    public void removeDeletesTheJobsEntriesOnly() throws Exception {
        classes.apply(jobClass("resnet-a", 3));
        classes.apply(jobClass("bert-b", 5, "device:leaf2"));
        assertTrue(classes.remove("resnet-a"));
        assertEquals(3, rules.removed.size());
        assertEquals(List.of(LEAF2), classEntries().stream().map(FlowRule::deviceId).collect(Collectors.toList()));
        assertEquals(5, assertClassEntry(classEntries().get(0), 1));
        assertFalse(classes.remove("resnet-a"));
        assertEquals(Optional.empty(), classes.get("resnet-a"));
        assertEquals(Optional.empty(), numbers.number("resnet-a"));
    }

    @Test
    public void deactivateRemovesEveryClassEntryAndLeavesThePlacements() throws Exception {
        aggregation.apply(placement("resnet-a", 0));
        classes.apply(jobClass("resnet-a", 3));
        classes.apply(jobClass("ps-only", 5, "device:leaf1"));
        int aggEntries = rules.installed(INGRESS_PIPE_AGGREGATION_AGG_JOB).size();
        assertEquals(2, aggEntries);
        TestTrafficClasses.deactivateApp(classes);
        assertEquals(List.of(), classEntries());
        assertEquals(List.of(), rules.removedByApp);
        assertEquals(aggEntries, rules.installed(INGRESS_PIPE_AGGREGATION_AGG_JOB).size());
        assertEquals(Optional.empty(), classes.get("resnet-a"));
        assertEquals(Optional.empty(), numbers.number("ps-only"));
        assertEquals(Optional.of(0), numbers.number("resnet-a"));
    }

    @Test
    public void deactivatingTheAppLeavesNoEntryOfIt() throws Exception {
        aggregation.apply(placement("resnet-a", 0));
        classes.apply(jobClass("resnet-a", 3));
        classes.apply(jobClass("ps-only", 5));
        assertEquals(8, rules.installed().size());
        // OSGi stops the components that use the job numbers in either order.
        TestTopology.deactivateApp(aggregation);
        TestTrafficClasses.deactivateApp(classes);
        assertEquals(List.of(), rules.installed());
        assertEquals(Optional.empty(), numbers.number("resnet-a"));
        assertEquals(Optional.empty(), numbers.number("ps-only"));
    }
}
