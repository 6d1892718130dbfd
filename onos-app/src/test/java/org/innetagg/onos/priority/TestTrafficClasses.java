package org.innetagg.onos.priority;

import org.innetagg.onos.aggregation.JobNumberRegistry;
import org.innetagg.onos.aggregation.JobNumberService;
import org.innetagg.onos.aggregation.TestTopology;

/** Traffic-class managers on {@link TestTopology} (leaf1, leaf2, spine1 up; leaf3 down; ovs1 not ours). */
public final class TestTrafficClasses {
    private TestTrafficClasses() {
    }

    /** A manager whose flow rules go nowhere, with job numbers of its own (for the REST tests). */
    public static TrafficClassService newManager() {
        return manager(new TestTopology.RecordingFlowRules(), new JobNumberRegistry());
    }

    /** A manager wired to the topology, recording its flow rules, taking numbers from {@code numbers}. */
    public static TrafficClassManager manager(TestTopology.RecordingFlowRules rules, JobNumberService numbers) {
        TrafficClassManager m = new TrafficClassManager();
        m.coreService = TestTopology.coreService();
        m.deviceService = TestTopology.deviceService();
        m.pipeconfService = TestTopology.pipeconfService();
        m.flowRuleService = rules;
        m.jobNumbers = numbers;
        m.activate();
        return m;
    }
}
