package org.innetagg.onos.aggregation;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.junit.Before;
import org.junit.Test;
import org.onosproject.net.flow.FlowRule;
import org.onosproject.net.flow.criteria.PiCriterion;
import org.onosproject.net.flow.instructions.PiInstruction;
import org.onosproject.net.pi.runtime.PiAction;
import org.onosproject.net.pi.runtime.PiActionParam;
import org.onosproject.net.pi.runtime.PiExactFieldMatch;

import java.io.InputStream;
import java.util.List;
import java.util.Map;
import java.util.stream.Collectors;

import static org.innetagg.onos.aggregation.TestTopology.LEAF1;
import static org.innetagg.onos.aggregation.TestTopology.LEAF2;
import static org.innetagg.onos.pipeconf.P4InfoConstants.FAN_IN;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_AGGREGATION_AGG_JOB;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_AGGREGATION_SET_JOB;
import static org.innetagg.onos.pipeconf.P4InfoConstants.JOB_ID;
import static org.innetagg.onos.pipeconf.P4InfoConstants.NEXT_HOP_PORT;
import static org.innetagg.onos.pipeconf.P4InfoConstants.POOL_BASE;
import static org.innetagg.onos.pipeconf.P4InfoConstants.POOL_SIZE;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertTrue;

/** Placement -> agg_job entries, through ONOS's service adapters. */
public class AggregationManagerTest {
    private TestTopology.RecordingFlowRules rules;
    private AggregationManager manager;

    static JobPlacement fixture(String job, String name) throws Exception {
        try (InputStream in = AggregationManagerTest.class.getResourceAsStream("/placements/" + name)) {
            return JobPlacement.decode(job, new ObjectMapper().readTree(in));
        }
    }

    /** valid.json as job {@code job}, its pools moved up by {@code shift} slots (so jobs do not overlap). */
    static JobPlacement validAs(String job, int shift) throws Exception {
        ObjectNode doc;
        try (InputStream in = AggregationManagerTest.class.getResourceAsStream("/placements/valid.json")) {
            doc = (ObjectNode) new ObjectMapper().readTree(in);
        }
        ObjectNode j = (ObjectNode) doc.get("jobs").get(0);
        j.put("job_id", job);
        for (JsonNode agg : j.get("aggregators")) {
            ObjectNode pool = (ObjectNode) agg.get("pool");
            pool.put("base", pool.get("base").asInt() + shift);
        }
        return JobPlacement.decode(job, doc);
    }

    @Before
    public void setUp() {
        rules = new TestTopology.RecordingFlowRules();
        manager = TestTopology.manager(rules);
    }

    @Test
    public void eachAggregatorBecomesOneAggJobEntry() throws Exception {
        AppliedPlacement applied = manager.apply(fixture("resnet-a", "valid.json"));
        assertTrue(applied.created);
        assertEquals(0, applied.p4JobId);
        assertEquals(2, rules.applied.size());
        Map<Object, FlowRule> byDevice = rules.applied.stream().collect(Collectors.toMap(FlowRule::deviceId, r -> r));
        // leaf1: the pinned path goes on to spine1 (leaf1 port 2); leaf2: the PS hangs on port 1.
        assertEntry(byDevice.get(LEAF1), 0, 0, 128, 2, 2);
        assertEntry(byDevice.get(LEAF2), 0, 128, 64, 2, 1);
        assertEquals(0, applied.document().get("p4_job_id").asInt());
    }

    @Test
    public void reapplyingIsIdempotentAndKeepsTheJobNumber() throws Exception {
        manager.apply(fixture("resnet-a", "valid.json"));
        AppliedPlacement again = manager.apply(fixture("resnet-a", "valid.json"));
        assertFalse(again.created);
        assertEquals(0, again.p4JobId);
        assertEquals(0, rules.removed.size());
    }

    @Test
    public void replacingRemovesTheEntriesOfDroppedAggregators() throws Exception {
        manager.apply(fixture("resnet-a", "valid.json"));
        manager.apply(fixture("resnet-a", "replaced.json"));
        assertEquals(1, rules.removed.size());
        assertEquals(LEAF1, rules.removed.get(0).deviceId());
        assertEquals(1, manager.get("resnet-a").orElseThrow().rules.size());
    }

    @Test
    public void secondJobGetsTheNextNumberAndItsOverlappingPoolIsRefused() throws Exception {
        manager.apply(fixture("resnet-a", "valid.json"));
        try {
            manager.apply(fixture("bert-b", "overlapping-job.json"));
            throw new AssertionError("overlapping pools accepted");
        } catch (InvalidPlacementException e) {
            assertEquals(409, e.status());
            assertTrue(e.getMessage(), e.getMessage().startsWith("jobs[0].aggregators[0].pool: "));
            assertTrue(e.getMessage(), e.getMessage().contains("job 'bert-b'")
                    && e.getMessage().contains("job 'resnet-a'"));
        }
        manager.remove("resnet-a");
        assertEquals(0, manager.apply(fixture("bert-b", "overlapping-job.json")).p4JobId);
    }

    @Test
    public void aSwitchIdThatIsNoDeviceIdIsRefusedNamingTheField() throws Exception {
        // DeviceId.deviceId throws IllegalArgumentException for these (not a URI; longer than
        // 1024 characters), which ONOS's REST layer answered as a 400 naming no field.
        for (String bad : new String[] {"not a uri", "%zz", "device:" + "x".repeat(1100)}) {
            ObjectNode doc;
            try (InputStream in = getClass().getResourceAsStream("/placements/valid.json")) {
                doc = (ObjectNode) new ObjectMapper().readTree(in);
            }
            ((ObjectNode) doc.get("jobs").get(0).get("aggregators").get(1)).put("switch", bad);
            try {
                manager.apply(JobPlacement.decode("resnet-a", doc));
                throw new AssertionError("switch '" + bad + "' accepted");
            } catch (InvalidPlacementException e) {
                assertEquals(400, e.status());
                assertEquals("jobs[0].aggregators[1].switch: unknown device '" + bad + "'", e.getMessage());
            }
        }
        assertTrue(rules.applied.isEmpty());
        assertFalse(manager.get("resnet-a").isPresent());
    }

    @Test
    public void placementsAreTheJobsInForceSortedById() throws Exception {
        assertEquals(List.of(), manager.placements());
        manager.apply(validAs("zeta", 0));
        manager.apply(validAs("alpha", 256));
        manager.apply(validAs("mid", 512));
        assertEquals(List.of("alpha", "mid", "zeta"), jobIds(manager.placements()));
        assertEquals(2, manager.placements().get(1).p4JobId);
        manager.remove("mid");
        assertEquals(List.of("alpha", "zeta"), jobIds(manager.placements()));
    }

    @Test
    public void placementsIsASnapshotNotALiveView() throws Exception {
        manager.apply(validAs("alpha", 0));
        List<AppliedPlacement> before = manager.placements();
        manager.apply(validAs("beta", 256));
        assertEquals(List.of("alpha"), jobIds(before));
        try {
            before.clear();
            throw new AssertionError("placements() is modifiable");
        } catch (UnsupportedOperationException expected) {
            assertEquals(2, manager.placements().size());
        }
    }

    private static List<String> jobIds(List<AppliedPlacement> placements) {
        return placements.stream().map(a -> a.placement.jobId).collect(Collectors.toList());
    }

    @Test
    public void removeAndDeactivateCleanUp() throws Exception {
        manager.apply(fixture("resnet-a", "valid.json"));
        assertTrue(manager.remove("resnet-a"));
        assertEquals(2, rules.removed.size());
        assertFalse(manager.remove("resnet-a"));
        assertFalse(manager.get("resnet-a").isPresent());
        TestTopology.deactivateApp(manager);
        assertEquals(1, rules.removedByApp.size());
        assertEquals(TestTopology.APP, rules.removedByApp.get(0));
    }

    private static void assertEntry(FlowRule rule, int job, long base, int size, int fanIn, long port) {
        assertEquals(INGRESS_PIPE_AGGREGATION_AGG_JOB, rule.table());
        PiCriterion match = (PiCriterion) rule.selector().criteria().iterator().next();
        PiExactFieldMatch exact = (PiExactFieldMatch) match.fieldMatch(JOB_ID).orElseThrow();
        assertEquals(job, unsigned(exact.value().asArray()));
        PiAction action = (PiAction) ((PiInstruction) rule.treatment().allInstructions().get(0)).action();
        assertEquals(INGRESS_PIPE_AGGREGATION_SET_JOB, action.id());
        Map<Object, Long> params = action.parameters().stream()
                .collect(Collectors.toMap(PiActionParam::id, p -> unsigned(p.value().asArray())));
        assertEquals(Map.of(POOL_BASE, base, POOL_SIZE, (long) size, FAN_IN, (long) fanIn, NEXT_HOP_PORT, port),
                params);
    }

    private static long unsigned(byte[] bytes) {
        long v = 0;
        for (byte b : bytes) {
            v = (v << 8) | (b & 0xff);
        }
        return v;
    }
}
