package org.innetagg.onos.pipeconf;

import org.onosproject.core.ApplicationId;
import org.onosproject.net.DeviceId;
import org.onosproject.net.behaviour.NextGroup;
import org.onosproject.net.behaviour.Pipeliner;
import org.onosproject.net.behaviour.PipelinerContext;
import org.onosproject.net.driver.AbstractHandlerBehaviour;
import org.onosproject.net.flow.DefaultFlowRule;
import org.onosproject.net.flow.FlowRule;
import org.onosproject.net.flow.FlowRuleService;
import org.onosproject.net.flowobjective.FilteringObjective;
import org.onosproject.net.flowobjective.ForwardingObjective;
import org.onosproject.net.flowobjective.NextObjective;
import org.onosproject.net.flowobjective.ObjectiveError;

import java.util.Collections;
import java.util.List;

import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_FORWARDING_TABLE0;

/**
 * Forwarding objectives become one rule in table0 (the interpreter maps it); the pipeline has
 * no filtering stage and no next-hop groups, so those objectives are refused as UNSUPPORTED.
 */
public class PipelinerImpl extends AbstractHandlerBehaviour implements Pipeliner {

    private DeviceId deviceId;
    private FlowRuleService flowRuleService;

    @Override
    public void init(DeviceId deviceId, PipelinerContext context) {
        this.deviceId = deviceId;
        this.flowRuleService = context.directory().get(FlowRuleService.class);
    }

    @Override
    public void filter(FilteringObjective obj) {
        obj.context().ifPresent(c -> c.onError(obj, ObjectiveError.UNSUPPORTED));
    }

    @Override
    public void forward(ForwardingObjective obj) {
        if (obj.treatment() == null) {
            obj.context().ifPresent(c -> c.onError(obj, ObjectiveError.UNSUPPORTED));
            return;
        }
        FlowRule rule = table0Rule(deviceId, obj);
        switch (obj.op()) {
            case ADD:
            case ADD_TO_EXISTING:
                flowRuleService.applyFlowRules(rule);
                break;
            case REMOVE:
            case REMOVE_FROM_EXISTING:
                flowRuleService.removeFlowRules(rule);
                break;
            default:
                obj.context().ifPresent(c -> c.onError(obj, ObjectiveError.UNSUPPORTED));
                return;
        }
        obj.context().ifPresent(c -> c.onSuccess(obj));
    }

    static FlowRule table0Rule(DeviceId deviceId, ForwardingObjective obj) {
        FlowRule.Builder rule = DefaultFlowRule.builder()
                .forDevice(deviceId)
                .forTable(INGRESS_PIPE_FORWARDING_TABLE0)
                .withSelector(obj.selector())
                .withTreatment(obj.treatment())
                .withPriority(obj.priority())
                .fromApp(obj.appId());
        if (obj.permanent()) {
            rule.makePermanent();
        } else {
            rule.makeTemporary(obj.timeout());
        }
        return rule.build();
    }

    @Override
    public void next(NextObjective obj) {
        obj.context().ifPresent(c -> c.onError(obj, ObjectiveError.UNSUPPORTED));
    }

    @Override
    public void purgeAll(ApplicationId appId) {
        flowRuleService.purgeFlowRules(deviceId, appId);
    }

    @Override
    public List<String> getNextMappings(NextGroup nextGroup) {
        return Collections.emptyList();
    }
}
