package org.innetagg.onos.priority;

import org.onosproject.core.ApplicationId;
import org.onosproject.net.DeviceId;
import org.onosproject.net.flow.DefaultFlowRule;
import org.onosproject.net.flow.DefaultTrafficSelector;
import org.onosproject.net.flow.DefaultTrafficTreatment;
import org.onosproject.net.flow.FlowRule;
import org.onosproject.net.flow.criteria.PiCriterion;
import org.onosproject.net.pi.runtime.PiAction;
import org.onosproject.net.pi.runtime.PiActionParam;

import static org.innetagg.onos.pipeconf.P4InfoConstants.AGG_JOB_ID;
import static org.innetagg.onos.pipeconf.P4InfoConstants.AGG_JOB_ID_BITWIDTH;
import static org.innetagg.onos.pipeconf.P4InfoConstants.CLASS;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_TRAFFIC_CLASS_SET_CLASS;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_TRAFFIC_CLASS_TRAFFIC_CLASS;
import static org.innetagg.onos.pipeconf.P4InfoConstants.IS_AGG;

/**
 * A job's class on one switch -> its traffic_class entry (docs/onos-aggregation-api.md,
 * "Traffic-class resource"): is_agg 1 and agg_job_id the job's number, the other (ternary)
 * fields left out, that is wildcards.
 */
public final class TrafficClassTranslator {
    /** The entry priority of the contract: ternary entries need one (P4Runtime: above 0). */
    public static final int PRIORITY = 100;

    private TrafficClassTranslator() {
    }

    public static FlowRule classRule(ApplicationId appId, DeviceId device, int p4JobId, int priorityClass) {
        PiCriterion match = PiCriterion.builder()
                .matchTernary(IS_AGG, 1, 1)
                .matchTernary(AGG_JOB_ID, p4JobId, (1 << AGG_JOB_ID_BITWIDTH) - 1)
                .build();
        PiAction setClass = PiAction.builder()
                .withId(INGRESS_PIPE_TRAFFIC_CLASS_SET_CLASS)
                .withParameter(new PiActionParam(CLASS, priorityClass))
                .build();
        return DefaultFlowRule.builder()
                .forDevice(device)
                .forTable(INGRESS_PIPE_TRAFFIC_CLASS_TRAFFIC_CLASS)
                .withSelector(DefaultTrafficSelector.builder().matchPi(match).build())
                .withTreatment(DefaultTrafficTreatment.builder().piTableAction(setClass).build())
                .withPriority(PRIORITY)
                .fromApp(appId)
                .makePermanent()
                .build();
    }
}
