package org.innetagg.onos.aggregation;

import org.innetagg.onos.TestElements;
import org.onosproject.core.ApplicationId;
import org.onosproject.core.CoreServiceAdapter;
import org.onosproject.core.DefaultApplicationId;
import org.onosproject.net.Device;
import org.onosproject.net.DeviceId;
import org.onosproject.net.Host;
import org.onosproject.net.HostId;
import org.onosproject.net.Link;
import org.onosproject.net.device.DeviceServiceAdapter;
import org.onosproject.net.flow.FlowRule;
import org.onosproject.net.flow.FlowRuleServiceAdapter;
import org.onosproject.net.host.HostServiceAdapter;
import org.onosproject.net.link.LinkServiceAdapter;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.stream.Collectors;

import static org.innetagg.onos.TestElements.host;
import static org.innetagg.onos.TestElements.link;

/**
 * leaf1 -- spine1 -- leaf2, host 01 on leaf1 port 1, host 04 on leaf2 port 1 (the device
 * and host ids of src/test/resources/placements/*.json); leaf3 exists but is down.
 */
public final class TestTopology {
    /** A manager on this topology whose flow rules go nowhere (for the REST tests). */
    public static AggregationService newManager() {
        return manager(new RecordingFlowRules());
    }

    static final ApplicationId APP = new DefaultApplicationId(7, AggregationManager.APP_NAME);
    static final DeviceId LEAF1 = DeviceId.deviceId("device:leaf1");
    static final DeviceId LEAF2 = DeviceId.deviceId("device:leaf2");
    static final DeviceId LEAF3 = DeviceId.deviceId("device:leaf3");
    static final DeviceId SPINE1 = DeviceId.deviceId("device:spine1");
    static final HostId H1 = HostId.hostId("00:00:00:00:00:01/None");
    static final HostId H4 = HostId.hostId("00:00:00:00:00:04/None");

    static final Map<DeviceId, Device> DEVICES = List.of(LEAF1, LEAF2, LEAF3, SPINE1).stream()
            .collect(Collectors.toMap(d -> d, TestElements::device));
    static final List<Link> LINKS = List.of(
            link(LEAF1, 2, SPINE1, 1), link(SPINE1, 1, LEAF1, 2),
            link(SPINE1, 2, LEAF2, 3), link(LEAF2, 3, SPINE1, 2));
    static final Map<HostId, Host> HOSTS = Map.of(H1, host(H1, LEAF1, 1), H4, host(H4, LEAF2, 1));

    private TestTopology() {
    }

    /** A manager wired to this topology and to a recording flow rule service. */
    static AggregationManager manager(RecordingFlowRules rules) {
        AggregationManager m = new AggregationManager();
        m.coreService = new CoreServiceAdapter() {
            @Override
            public ApplicationId registerApplication(String name) {
                return APP;
            }
        };
        m.deviceService = new DeviceServiceAdapter() {
            @Override
            public Device getDevice(DeviceId id) {
                return DEVICES.get(id);
            }

            @Override
            public boolean isAvailable(DeviceId id) {
                return DEVICES.containsKey(id) && !id.equals(LEAF3);
            }
        };
        m.linkService = new LinkServiceAdapter() {
            @Override
            public Set<Link> getDeviceEgressLinks(DeviceId id) {
                return LINKS.stream().filter(l -> l.src().deviceId().equals(id)).collect(Collectors.toSet());
            }
        };
        m.hostService = new HostServiceAdapter() {
            @Override
            public Host getHost(HostId id) {
                return HOSTS.get(id);
            }
        };
        m.flowRuleService = rules;
        m.activate();
        return m;
    }

    /** Records what the manager applies and removes. */
    static final class RecordingFlowRules extends FlowRuleServiceAdapter {
        final List<FlowRule> applied = new ArrayList<>();
        final List<FlowRule> removed = new ArrayList<>();
        final List<ApplicationId> removedByApp = new ArrayList<>();

        @Override
        public void applyFlowRules(FlowRule... flowRules) {
            applied.addAll(Arrays.asList(flowRules));
        }

        @Override
        public void removeFlowRules(FlowRule... flowRules) {
            removed.addAll(Arrays.asList(flowRules));
        }

        @Override
        public void removeFlowRulesById(ApplicationId id) {
            removedByApp.add(id);
        }
    }
}
