package org.innetagg.onos.aggregation;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.innetagg.onos.TestStorage;
import org.innetagg.onos.priority.AppliedClass;
import org.innetagg.onos.priority.JobClass;
import org.innetagg.onos.priority.TestTrafficClasses;
import org.innetagg.onos.priority.TrafficClassManager;
import org.junit.Test;
import org.onosproject.net.DeviceId;
import org.onosproject.net.flow.FlowRule;

import java.io.InputStream;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.Callable;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;

import static org.innetagg.onos.aggregation.JobNumberService.Holder.AGGREGATION;
import static org.innetagg.onos.aggregation.JobNumberService.Holder.TRAFFIC_CLASS;
import static org.innetagg.onos.aggregation.TestTopology.LEAF1;
import static org.innetagg.onos.aggregation.TestTopology.LEAF2;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_AGGREGATION_AGG_JOB;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_TRAFFIC_CLASS_TRAFFIC_CLASS;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertTrue;

/**
 * The app's state on a cluster: nodes are managers sharing one {@link TestStorage} (ONOS's
 * test maps, shared by name and atomic as Atomix's are) and, where they write rules, one
 * recording flow rule service (ONOS's flow rule store is the cluster's too).
 */
public class ClusterStateTest {
    private static final ObjectMapper JSON = new ObjectMapper();

    private final TestStorage storage = new TestStorage();
    private final TestTopology.RecordingFlowRules switches = new TestTopology.RecordingFlowRules();

    /** One node's aggregation and traffic-class managers over the shared store. */
    private final class Node {
        final JobNumberRegistry numbers = TestTopology.numbers(storage);
        final AggregationManager aggregation;
        final TrafficClassManager classes;

        Node(TestTopology.RecordingFlowRules rules) {
            aggregation = TestTopology.manager(rules, numbers, storage);
            classes = TestTrafficClasses.manager(rules, numbers, storage);
        }
    }

    private static JobPlacement placement(String job, int shift) throws Exception {
        return AggregationManagerTest.validAs(job, shift);
    }

    private static JobClass jobClass(String job, int cls, String... switches) throws Exception {
        ObjectNode doc = JSON.createObjectNode().put("job_id", job).put("priority_class", cls);
        if (switches.length > 0) {
            List.of(switches).forEach(doc.putArray("switches")::add);
        }
        return JobClass.decode(job, doc);
    }

    private Set<FlowRule> installed(org.onosproject.net.flow.TableId table) {
        return new HashSet<>(switches.installed(table));
    }

    private static void assertSameRules(Iterable<FlowRule> expected, Iterable<FlowRule> actual) {
        Map<Object, FlowRule> want = new HashMap<>();
        expected.forEach(r -> want.put(r.id(), r));
        Map<Object, FlowRule> got = new HashMap<>();
        actual.forEach(r -> got.put(r.id(), r));
        assertEquals(want.keySet(), got.keySet());
        want.forEach((id, r) -> assertTrue(r + " differs", r.exactMatch(got.get(id))));
    }

    @Test
    public void twoNodesSeeAndChangeTheSameJobs() throws Exception {
        Node a = new Node(switches);
        Node b = new Node(switches);
        AppliedPlacement placed = a.aggregation.apply(placement("resnet-a", 0));
        AppliedPlacement seen = b.aggregation.get("resnet-a").orElseThrow();
        assertEquals(placed.document(), seen.document());
        assertEquals(placed.p4JobId, seen.p4JobId);
        assertSameRules(placed.rules, seen.rules);
        assertEquals(List.of("resnet-a"),
                b.aggregation.placements().stream().map(p -> p.placement.jobId).collect(Collectors.toList()));

        // The class posted on b takes the number a's placement holds; a serves it back.
        AppliedClass cls = b.classes.apply(jobClass("resnet-a", 5, "device:leaf1"));
        assertEquals(placed.p4JobId, cls.p4JobId);
        assertEquals(cls.document(), a.classes.get("resnet-a").orElseThrow().document());

        // b replaces a's placement: it removes the entries a wrote and b's replacement drops.
        AppliedPlacement replaced = b.aggregation.apply(AggregationManagerTest.fixture("resnet-a", "replaced.json"));
        assertFalse(replaced.created);
        assertSameRules(replaced.rules, installed(INGRESS_PIPE_AGGREGATION_AGG_JOB));
        assertEquals(replaced.document(), a.aggregation.get("resnet-a").orElseThrow().document());

        // A second job placed on b is refused on a when its pools overlap (a reads b's placement).
        try {
            a.aggregation.apply(AggregationManagerTest.fixture("bert-b", "overlapping-job.json"));
        } catch (InvalidPlacementException e) {
            throw new AssertionError("replaced.json frees leaf1's pool: " + e.getMessage());
        }
        assertEquals(Set.of(0, 1), Set.of(a.numbers.number("resnet-a").orElseThrow(),
                b.numbers.number("bert-b").orElseThrow()));

        assertTrue(a.aggregation.remove("resnet-a"));
        assertFalse(b.aggregation.get("resnet-a").isPresent());
        assertFalse(b.aggregation.remove("resnet-a"));
        // Still held by its class (posted on b), freed when a deletes that.
        assertEquals(Optional.of(placed.p4JobId), b.numbers.number("resnet-a"));
        assertTrue(a.classes.remove("resnet-a"));
        assertEquals(Optional.empty(), b.numbers.number("resnet-a"));
        assertEquals(List.of(), switches.installed(INGRESS_PIPE_TRAFFIC_CLASS_TRAFFIC_CLASS));
    }

    @Test
    public void twoNodesNeverBothTakeOverlappingPools() throws Exception {
        // Two nodes place two jobs whose pools overlap on leaf1, at once, many times: the
        // check and the write are one step across the cluster, so exactly one is accepted.
        Node a = new Node(switches);
        Node b = new Node(switches);
        ExecutorService pool = Executors.newFixedThreadPool(2);
        try {
            for (int round = 0; round < 200; round++) {
                CyclicBarrier start = new CyclicBarrier(2);
                String first = "first-" + round;
                String second = "second-" + round;
                Callable<Boolean> one = () -> {
                    start.await();
                    try {
                        a.aggregation.apply(AggregationManagerTest.validAs(first, 0));
                        return true;
                    } catch (InvalidPlacementException e) {
                        return false;
                    }
                };
                Callable<Boolean> two = () -> {
                    start.await();
                    try {
                        b.aggregation.apply(AggregationManagerTest.validAs(second, 8));
                        return true;
                    } catch (InvalidPlacementException e) {
                        return false;
                    }
                };
                Future<Boolean> x = pool.submit(one);
                Future<Boolean> y = pool.submit(two);
                boolean gotX = x.get(60, TimeUnit.SECONDS);
                boolean gotY = y.get(60, TimeUnit.SECONDS);
                assertTrue("round " + round + ": both or neither placed", gotX ^ gotY);
                assertTrue(a.aggregation.remove(gotX ? first : second));
            }
        } finally {
            pool.shutdownNow();
        }
    }

    @Test
    public void theSlotLedgerAloneRefusesOverlapsAcrossNodes() throws Exception {
        // Without the placement lock: two nodes' ledgers over one map, the two jobs' claims
        // on leaf1 written at once, many times. Compare-and-set lets exactly one through, and
        // the refusal names both jobs with 409.
        PoolClaims a = new PoolClaims(storage.<String, String>consistentMapBuilder()
                .withName(AggregationManager.CLAIMS).withSerializer(AggregationManager.SERIALIZER).build());
        PoolClaims b = new PoolClaims(storage.<String, String>consistentMapBuilder()
                .withName(AggregationManager.CLAIMS).withSerializer(AggregationManager.SERIALIZER).build());
        ExecutorService pool = Executors.newFixedThreadPool(2);
        try {
            for (int round = 0; round < 500; round++) {
                CyclicBarrier start = new CyclicBarrier(2);
                JobPlacement first = placement("first-" + round, 0);
                JobPlacement second = placement("second-" + round, 8);
                Callable<String> one = () -> {
                    start.await();
                    try {
                        a.set(first, Map.of(), true);
                        return null;
                    } catch (InvalidPlacementException e) {
                        assertEquals(409, e.status());
                        return e.getMessage();
                    }
                };
                Callable<String> two = () -> {
                    start.await();
                    try {
                        b.set(second, Map.of(), true);
                        return null;
                    } catch (InvalidPlacementException e) {
                        assertEquals(409, e.status());
                        return e.getMessage();
                    }
                };
                Future<String> x = pool.submit(one);
                Future<String> y = pool.submit(two);
                String refusedX = x.get(60, TimeUnit.SECONDS);
                String refusedY = y.get(60, TimeUnit.SECONDS);
                assertTrue("round " + round + ": both or neither placed", (refusedX == null) ^ (refusedY == null));
                String why = refusedX == null ? refusedY : refusedX;
                assertTrue(why, why.contains("'first-" + round + "'") && why.contains("'second-" + round + "'"));
                JobPlacement won = refusedX == null ? first : second;
                assertFalse(a.held(LEAF1.toString(), won.jobId).isEmpty());
                a.release(won.jobId, PoolClaims.of(won).keySet());
                assertTrue(b.held(LEAF1.toString(), won.jobId).isEmpty());
            }
        } finally {
            pool.shutdownNow();
        }
    }

    @Test
    public void jobNumbersNeverCollideWhenNodesAllocateAtOnce() throws Exception {
        List<JobNumberRegistry> nodes = List.of(TestTopology.numbers(storage), TestTopology.numbers(storage),
                TestTopology.numbers(storage), TestTopology.numbers(storage));
        int jobsEach = 60;
        CyclicBarrier start = new CyclicBarrier(nodes.size());
        ExecutorService pool = Executors.newFixedThreadPool(nodes.size());
        try {
            List<Future<Map<String, Integer>>> results = new ArrayList<>();
            for (int n = 0; n < nodes.size(); n++) {
                JobNumberRegistry node = nodes.get(n);
                int me = n;
                Callable<Map<String, Integer>> work = () -> {
                    start.await();
                    Map<String, Integer> got = new HashMap<>();
                    for (int j = 0; j < jobsEach; j++) {
                        // Every node also takes numbers for the same shared jobs, in turn.
                        String job = j % 4 == 0 ? "shared-" + j : "node" + me + "-" + j;
                        got.put(job, node.acquire(job, me % 2 == 0 ? AGGREGATION : TRAFFIC_CLASS));
                    }
                    return got;
                };
                results.add(pool.submit(work));
            }
            Map<String, Integer> byJob = new HashMap<>();
            for (Future<Map<String, Integer>> r : results) {
                for (Map.Entry<String, Integer> e : r.get(60, TimeUnit.SECONDS).entrySet()) {
                    Integer before = byJob.putIfAbsent(e.getKey(), e.getValue());
                    assertTrue(e.getKey() + " got two numbers", before == null || before.equals(e.getValue()));
                }
            }
            // 4 nodes x 45 own jobs + 15 shared ones.
            assertEquals(195, byJob.size());
            assertEquals("a number given to two jobs", byJob.size(), new HashSet<>(byJob.values()).size());
            for (Map.Entry<String, Integer> e : byJob.entrySet()) {
                assertEquals(Optional.of(e.getValue()), nodes.get(0).number(e.getKey()));
            }
        } finally {
            pool.shutdownNow();
        }
    }

    @Test
    public void classesPostedOnTwoNodesAtOnceGetDistinctNumbers() throws Exception {
        List<Node> nodes = List.of(new Node(switches), new Node(new TestTopology.RecordingFlowRules()));
        CyclicBarrier start = new CyclicBarrier(nodes.size());
        ExecutorService pool = Executors.newFixedThreadPool(nodes.size());
        try {
            List<Future<List<Integer>>> results = new ArrayList<>();
            for (int n = 0; n < nodes.size(); n++) {
                TrafficClassManager classes = nodes.get(n).classes;
                String prefix = "n" + n + "-";
                results.add(pool.submit(() -> {
                    start.await();
                    List<Integer> got = new ArrayList<>();
                    for (int j = 0; j < 100; j++) {
                        got.add(classes.apply(jobClass(prefix + j, j % 8, "device:leaf1")).p4JobId);
                    }
                    return got;
                }));
            }
            Set<Integer> all = new HashSet<>();
            for (Future<List<Integer>> r : results) {
                all.addAll(r.get(60, TimeUnit.SECONDS));
            }
            assertEquals(200, all.size());
            assertEquals(200, nodes.get(0).classes.classes().size());
        } finally {
            pool.shutdownNow();
        }
    }

    @Test
    public void aNodeStartedOverTheStoreRestoresTheJobsAndRederivesTheirEntries() throws Exception {
        Node before = new Node(switches);
        AppliedPlacement placed = before.aggregation.apply(placement("resnet-a", 0));
        before.aggregation.apply(placement("bert-b", 256));
        AppliedClass cls = before.classes.apply(jobClass("resnet-a", 3));
        FlowRule gone = before.aggregation.get("bert-b").orElseThrow().rules.get(0);
        assertTrue(before.aggregation.remove("bert-b"));
        // The node stops (ONOS shuts down): nothing is forgotten, nothing removed.
        TestTopology.deactivate(before.aggregation);
        assertSameRules(placed.rules, installed(INGRESS_PIPE_AGGREGATION_AGG_JOB));

        // The switches lost their entries, and one of a deleted job came back (a crash between
        // a DELETE's record and its rules, say).
        switches.wipe();
        switches.install(gone);
        Node after = new Node(switches);
        AppliedPlacement restored = after.aggregation.get("resnet-a").orElseThrow();
        assertEquals(placed.document(), restored.document());
        assertEquals(placed.p4JobId, restored.p4JobId);
        assertFalse(after.aggregation.get("bert-b").isPresent());
        assertSameRules(placed.rules, installed(INGRESS_PIPE_AGGREGATION_AGG_JOB));
        assertSameRules(cls.rules, installed(INGRESS_PIPE_TRAFFIC_CLASS_TRAFFIC_CLASS));
        assertEquals(cls.document(), after.classes.get("resnet-a").orElseThrow().document());
        // The restored job keeps its number: a new one gets the next.
        assertEquals(1, after.aggregation.apply(placement("gpt-c", 512)).p4JobId);
    }

    @Test
    public void rulesNeverWrittenAreWrittenWhenANodeBecomesTheDevicesMaster() throws Exception {
        // A node recorded the placement and died before its rules reached the switches.
        Node dead = new Node(new TestTopology.RecordingFlowRules());
        AppliedPlacement placed = dead.aggregation.apply(placement("resnet-a", 0));
        Node survivor = new Node(switches);
        switches.wipe();  // what the activation reconciled, to see what mastership does alone
        TestTopology.becomeMaster(survivor.aggregation, LEAF1);
        assertEquals(Set.of(LEAF1), switches.installed(INGRESS_PIPE_AGGREGATION_AGG_JOB).stream()
                .map(FlowRule::deviceId).collect(Collectors.toSet()));
        TestTopology.becomeMaster(survivor.aggregation, LEAF2);
        assertSameRules(placed.rules, installed(INGRESS_PIPE_AGGREGATION_AGG_JOB));
    }

    @Test
    public void aDeviceWhoseEntriesCannotBeReadDoesNotStopTheOthersAndIsRepairedLater() throws Exception {
        // After a node dies, reading a device it still masters times out in ONOS's flow store
        // (FlowRuleStoreException.Timeout, 30 s): the survivor's pass must still write the
        // devices it took over (the CI failure of 2026-11-27: a pass over every device gave up
        // at the dead node's device, and the placement's entries never came back).
        Node dead = new Node(new TestTopology.RecordingFlowRules());
        AppliedPlacement placed = dead.aggregation.apply(placement("resnet-a", 0));
        Set<DeviceId> unreadable = new HashSet<>(Set.of(LEAF2));
        TestTopology.RecordingFlowRules flaky = new TestTopology.RecordingFlowRules() {
            @Override
            public Iterable<org.onosproject.net.flow.FlowEntry> getFlowEntries(DeviceId id) {
                if (unreadable.contains(id)) {
                    throw new IllegalStateException("flow store timeout on " + id);
                }
                return super.getFlowEntries(id);
            }

            @Override  // as ONOS's: every device's entries, so it throws too
            public Iterable<org.onosproject.net.flow.FlowEntry> getFlowEntriesById(
                    org.onosproject.core.ApplicationId id) {
                if (!unreadable.isEmpty()) {
                    throw new IllegalStateException("flow store timeout on " + unreadable);
                }
                return super.getFlowEntriesById(id);
            }
        };
        Node survivor = new Node(flaky);  // its activation's pass over every device
        assertEquals(Set.of(LEAF1), flaky.installed(INGRESS_PIPE_AGGREGATION_AGG_JOB).stream()
                .map(FlowRule::deviceId).collect(Collectors.toSet()));
        unreadable.clear();  // the dead node's device taken over: the next pass repairs it
        survivor.aggregation.reconcile(d -> true);
        assertSameRules(placed.rules, new HashSet<>(flaky.installed(INGRESS_PIPE_AGGREGATION_AGG_JOB)));
    }

    @Test
    public void twoNodesReplacingOneJobAtOnceLeaveTheLastRecordOnTheSwitches() throws Exception {
        Node b = new Node(switches);
        JobPlacement second = AggregationManagerTest.fixture("resnet-a", "replaced.json");
        ObjectNode moved;
        try (InputStream in = getClass().getResourceAsStream("/placements/replaced.json")) {
            moved = (ObjectNode) JSON.readTree(in);
        }
        ((ObjectNode) moved.get("jobs").get(0).get("aggregators").get(0).get("pool")).put("base", 256);
        JobPlacement bPlacement = JobPlacement.decode("resnet-a", moved);
        assertEquals(second.jobId, bPlacement.jobId);
        // a's rules reach the flow rule store only after b has replaced a's record and written
        // b's rules (a slow node): without a's check after writing, leaf1 would keep a's entry
        // and leaf2 a's pool.
        TestTopology.RecordingFlowRules slow = new TestTopology.RecordingFlowRules() {
            private boolean first = true;

            @Override
            public void applyFlowRules(FlowRule... flowRules) {
                if (first) {
                    first = false;
                    try {
                        b.aggregation.apply(bPlacement);
                    } catch (InvalidPlacementException e) {
                        throw new AssertionError(e);
                    }
                }
                switches.applyFlowRules(flowRules);
            }

            @Override
            public void removeFlowRules(FlowRule... flowRules) {
                switches.removeFlowRules(flowRules);
            }

            @Override
            public Iterable<org.onosproject.net.flow.FlowEntry> getFlowEntriesById(
                    org.onosproject.core.ApplicationId id) {
                return switches.getFlowEntriesById(id);
            }

            @Override
            public Iterable<org.onosproject.net.flow.FlowEntry> getFlowEntries(
                    org.onosproject.net.DeviceId id) {
                return switches.getFlowEntries(id);
            }
        };
        Node a = new Node(slow);
        a.aggregation.apply(placement("resnet-a", 0));
        AppliedPlacement last = b.aggregation.get("resnet-a").orElseThrow();
        assertEquals(moved, last.placement.document);
        assertSameRules(last.rules, installed(INGRESS_PIPE_AGGREGATION_AGG_JOB));
        assertEquals(Set.of(LEAF2), installed(INGRESS_PIPE_AGGREGATION_AGG_JOB).stream()
                .map(FlowRule::deviceId).collect(Collectors.toSet()));
    }

    @Test
    public void deactivatingTheAppForgetsTheJobsOnEveryNode() throws Exception {
        Node a = new Node(switches);
        Node b = new Node(switches);
        a.aggregation.apply(placement("resnet-a", 0));
        b.classes.apply(jobClass("resnet-a", 2));
        // ONOS runs every node's hook; the second finds nothing left to do.
        TestTopology.deactivateApp(a.aggregation);
        TestTrafficClasses.deactivateApp(a.classes);
        TestTopology.deactivateApp(b.aggregation);
        TestTrafficClasses.deactivateApp(b.classes);
        Node later = new Node(switches);
        assertEquals(List.of(), later.aggregation.placements());
        assertEquals(List.of(), later.classes.classes());
        assertEquals(Optional.empty(), later.numbers.number("resnet-a"));
        assertEquals(List.of(), switches.installed());
    }
}
