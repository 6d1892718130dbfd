package org.innetagg.onos.aggregation;

import org.onosproject.core.ApplicationId;
import org.onosproject.net.DeviceId;
import org.onosproject.net.PortNumber;
import org.onosproject.net.flow.DefaultFlowRule;
import org.onosproject.net.flow.DefaultTrafficSelector;
import org.onosproject.net.flow.DefaultTrafficTreatment;
import org.onosproject.net.flow.FlowRule;
import org.onosproject.net.flow.criteria.PiCriterion;
import org.onosproject.net.pi.runtime.PiAction;
import org.onosproject.net.pi.runtime.PiActionParam;

import static org.innetagg.onos.pipeconf.P4InfoConstants.FAN_IN;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_AGGREGATION_AGG_JOB;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_AGGREGATION_SET_JOB;
import static org.innetagg.onos.pipeconf.P4InfoConstants.JOB_ID;
import static org.innetagg.onos.pipeconf.P4InfoConstants.NEXT_HOP_PORT;
import static org.innetagg.onos.pipeconf.P4InfoConstants.POOL_BASE;
import static org.innetagg.onos.pipeconf.P4InfoConstants.POOL_SIZE;

/** One aggregator of a placement -> its agg_job entry (docs/onos-aggregation-api.md). */
public final class AggregationTranslator {
    /** agg_job is an exact-match table: P4Runtime ignores the priority, ONOS requires one. */
    static final int PRIORITY = 10;

    private AggregationTranslator() {
    }

    public static FlowRule aggJobRule(ApplicationId appId, DeviceId device, int p4JobId, AggregatorConfig agg,
                                      PortNumber nextHopPort) {
        PiCriterion match = PiCriterion.builder().matchExact(JOB_ID, p4JobId).build();
        PiAction setJob = PiAction.builder()
                .withId(INGRESS_PIPE_AGGREGATION_SET_JOB)
                .withParameter(new PiActionParam(POOL_BASE, agg.poolBase))
                .withParameter(new PiActionParam(POOL_SIZE, agg.poolSize))
                .withParameter(new PiActionParam(FAN_IN, agg.fanIn))
                .withParameter(new PiActionParam(NEXT_HOP_PORT, nextHopPort.toLong()))
                .build();
        return DefaultFlowRule.builder()
                .forDevice(device)
                .forTable(INGRESS_PIPE_AGGREGATION_AGG_JOB)
                .withSelector(DefaultTrafficSelector.builder().matchPi(match).build())
                .withTreatment(DefaultTrafficTreatment.builder().piTableAction(setJob).build())
                .withPriority(PRIORITY)
                .fromApp(appId)
                .makePermanent()
                .build();
    }
}
