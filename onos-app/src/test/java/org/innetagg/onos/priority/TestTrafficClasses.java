package org.innetagg.onos.priority;

import org.innetagg.onos.TestStorage;
import org.innetagg.onos.aggregation.JobNumberService;
import org.innetagg.onos.aggregation.TestTopology;
import org.onosproject.store.service.StorageService;

/** Traffic-class managers on {@link TestTopology} (leaf1, leaf2, spine1 up; leaf3 down; ovs1 not ours). */
public final class TestTrafficClasses {
    private TestTrafficClasses() {
    }

    /** A manager whose flow rules go nowhere, with job numbers of its own (for the REST tests). */
    public static TrafficClassService newManager() {
        TestStorage storage = new TestStorage();
        return manager(new TestTopology.RecordingFlowRules(), TestTopology.numbers(storage), storage);
    }

    /**
     * A manager wired to the topology, recording its flow rules, taking numbers from
     * {@code numbers}, keeping its classes in {@code storage}.
     */
    public static TrafficClassManager manager(TestTopology.RecordingFlowRules rules, JobNumberService numbers,
                                              StorageService storage) {
        TrafficClassManager m = new TrafficClassManager();
        m.coreService = TestTopology.coreService();
        m.storageService = storage;
        m.mastershipService = new TestTopology.TestMastership();
        m.reconciler = Runnable::run;
        m.deviceService = TestTopology.deviceService();
        m.pipeconfService = TestTopology.pipeconfService();
        m.flowRuleService = rules;
        m.jobNumbers = numbers;
        m.activate();
        return m;
    }

    /** The operator deactivates the app: ONOS runs the manager's hook, then stops it. */
    public static void deactivateApp(TrafficClassManager m) {
        ((TestTopology.TestCore) m.coreService).deactivateApp();
        m.deactivate();
    }
}
