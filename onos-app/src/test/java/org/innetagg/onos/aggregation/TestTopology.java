package org.innetagg.onos.aggregation;

import org.innetagg.onos.TestElements;
import org.innetagg.onos.TestStorage;
import org.innetagg.onos.pipeconf.PipeconfLoader;
import org.onosproject.core.ApplicationId;
import org.onosproject.core.CoreServiceAdapter;
import org.onosproject.core.DefaultApplicationId;
import org.onosproject.net.Device;
import org.onosproject.net.DeviceId;
import org.onosproject.net.Host;
import org.onosproject.net.HostId;
import org.onosproject.net.Link;
import org.onosproject.net.device.DeviceService;
import org.onosproject.net.device.DeviceServiceAdapter;
import org.onosproject.mastership.MastershipEvent;
import org.onosproject.mastership.MastershipInfo;
import org.onosproject.mastership.MastershipListener;
import org.onosproject.mastership.MastershipServiceAdapter;
import org.onosproject.net.flow.DefaultFlowEntry;
import org.onosproject.net.flow.FlowEntry;
import org.onosproject.net.flow.FlowId;
import org.onosproject.net.flow.FlowRule;
import org.onosproject.net.flow.FlowRuleServiceAdapter;
import org.onosproject.net.flow.TableId;
import org.onosproject.net.host.HostServiceAdapter;
import org.onosproject.net.link.LinkServiceAdapter;
import org.onosproject.net.pi.PiPipeconfServiceAdapter;
import org.onosproject.net.pi.model.PiPipeconfId;
import org.onosproject.net.pi.service.PiPipeconfService;
import org.onosproject.store.service.StorageService;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.stream.Collectors;

import static org.innetagg.onos.TestElements.host;
import static org.innetagg.onos.TestElements.link;

/**
 * leaf1 -- spine1 -- leaf2, host 01 on leaf1 port 1, host 04 on leaf2 port 1 (the device
 * and host ids of src/test/resources/placements/*.json); leaf3 exists but is down. These four
 * run our pipeconf; ovs1 is up but runs another pipeline (no pipeconf of ours).
 */
public final class TestTopology {
    /** A manager on this topology whose flow rules go nowhere (for the REST tests). */
    public static AggregationService newManager() {
        return manager(new RecordingFlowRules());
    }

    /** Job numbers in {@code storage} (one registry per node; nodes share the storage). */
    public static JobNumberRegistry numbers(StorageService storage) {
        JobNumberRegistry numbers = new JobNumberRegistry();
        numbers.storageService = storage;
        numbers.activate();
        return numbers;
    }

    public static final ApplicationId APP = new DefaultApplicationId(7, AggregationManager.APP_NAME);
    public static final DeviceId LEAF1 = DeviceId.deviceId("device:leaf1");
    public static final DeviceId LEAF2 = DeviceId.deviceId("device:leaf2");
    public static final DeviceId LEAF3 = DeviceId.deviceId("device:leaf3");
    public static final DeviceId SPINE1 = DeviceId.deviceId("device:spine1");
    /** Up, but not running the innet-agg pipeconf. */
    public static final DeviceId OVS1 = DeviceId.deviceId("device:ovs1");
    static final HostId H1 = HostId.hostId("00:00:00:00:00:01/None");
    static final HostId H4 = HostId.hostId("00:00:00:00:00:04/None");

    static final Map<DeviceId, Device> DEVICES = List.of(LEAF1, LEAF2, LEAF3, SPINE1, OVS1).stream()
            .collect(Collectors.toMap(d -> d, TestElements::device));
    static final Set<DeviceId> OUR_PIPECONF = Set.of(LEAF1, LEAF2, LEAF3, SPINE1);
    static final List<Link> LINKS = List.of(
            link(LEAF1, 2, SPINE1, 1), link(SPINE1, 1, LEAF1, 2),
            link(SPINE1, 2, LEAF2, 3), link(LEAF2, 3, SPINE1, 2));
    static final Map<HostId, Host> HOSTS = Map.of(H1, host(H1, LEAF1, 1), H4, host(H4, LEAF2, 1));

    private TestTopology() {
    }

    /** A manager wired to this topology and to a recording flow rule service, with a store of its own. */
    static AggregationManager manager(RecordingFlowRules rules) {
        TestStorage storage = new TestStorage();
        return manager(rules, numbers(storage), storage);
    }

    /**
     * The same, one node's: job numbers from {@code numbers} (shared with a traffic-class
     * manager), placements in {@code storage} (shared with other nodes' managers).
     */
    public static AggregationManager manager(RecordingFlowRules rules, JobNumberService numbers,
                                             StorageService storage) {
        AggregationManager m = new AggregationManager();
        m.coreService = coreService();
        m.storageService = storage;
        m.mastershipService = new TestMastership();
        m.reconciler = Runnable::run;
        m.deviceService = deviceService();
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
        m.jobNumbers = numbers;
        m.activate();
        return m;
    }

    /** Stops the manager as OSGi would when its node stops (for tests outside this package). */
    public static void deactivate(AggregationManager m) {
        m.deactivate();
    }

    /** The operator deactivates the app: ONOS runs the hook the manager registered, then stops it. */
    public static void deactivateApp(AggregationManager m) {
        ((TestCore) m.coreService).deactivateApp();
        m.deactivate();
    }

    /** A device's mastership moves to the manager's node (ONOS's MASTER_CHANGED event). */
    public static void becomeMaster(AggregationManager m, DeviceId device) {
        ((TestMastership) m.mastershipService).becomeMaster(device);
    }

    /** Registers the app as {@link #APP}. */
    public static TestCore coreService() {
        return new TestCore();
    }

    /** Registers the app as {@link #APP}, keeping the hooks ONOS runs when the app is deactivated. */
    public static final class TestCore extends CoreServiceAdapter {
        private final List<Runnable> hooks = new ArrayList<>();

        @Override
        public ApplicationId registerApplication(String name) {
            return APP;
        }

        @Override
        public ApplicationId registerApplication(String name, Runnable preDeactivate) {
            hooks.add(preDeactivate);
            return APP;
        }

        /** Runs the hooks, as ONOS's ApplicationManager does before it uninstalls the app's features. */
        public void deactivateApp() {
            hooks.forEach(Runnable::run);
            hooks.clear();
        }
    }

    /** This node is master of the devices it was told of, and tells its listeners when that changes. */
    public static final class TestMastership extends MastershipServiceAdapter {
        private final Set<DeviceId> local = new HashSet<>();
        private final List<MastershipListener> listeners = new ArrayList<>();

        @Override
        public boolean isLocalMaster(DeviceId deviceId) {
            return local.contains(deviceId);
        }

        @Override
        public void addListener(MastershipListener listener) {
            listeners.add(listener);
        }

        @Override
        public void removeListener(MastershipListener listener) {
            listeners.remove(listener);
        }

        public void becomeMaster(DeviceId device) {
            local.add(device);
            MastershipEvent event = new MastershipEvent(MastershipEvent.Type.MASTER_CHANGED, device,
                    new MastershipInfo());
            List.copyOf(listeners).forEach(l -> l.event(event));
        }
    }

    /** The devices of this topology; all but leaf3 are available. */
    public static DeviceService deviceService() {
        return new DeviceServiceAdapter() {
            @Override
            public Device getDevice(DeviceId id) {
                return DEVICES.get(id);
            }

            @Override
            public boolean isAvailable(DeviceId id) {
                return DEVICES.containsKey(id) && !id.equals(LEAF3);
            }

            @Override
            public Iterable<Device> getAvailableDevices() {
                return DEVICES.values().stream().filter(d -> isAvailable(d.id())).collect(Collectors.toList());
            }

            @Override
            public Iterable<Device> getDevices() {
                return List.copyOf(DEVICES.values());
            }
        };
    }

    /** ONOS's device -> pipeconf binding: ours on every device but ovs1. */
    public static PiPipeconfService pipeconfService() {
        return new PiPipeconfServiceAdapter() {
            @Override
            public Optional<PiPipeconfId> ofDevice(DeviceId id) {
                return OUR_PIPECONF.contains(id) ? Optional.of(PipeconfLoader.PIPECONF_ID)
                        : Optional.empty();
            }
        };
    }

    /**
     * Records what the manager applies and removes, and keeps what would be on the switches:
     * like ONOS, a rule with the flow id of an installed one replaces it.
     */
    public static class RecordingFlowRules extends FlowRuleServiceAdapter {
        public final List<FlowRule> applied = new ArrayList<>();
        public final List<FlowRule> removed = new ArrayList<>();
        public final List<ApplicationId> removedByApp = new ArrayList<>();
        private final Map<FlowId, FlowRule> installed = new LinkedHashMap<>();

        @Override
        public void applyFlowRules(FlowRule... flowRules) {
            applied.addAll(Arrays.asList(flowRules));
            Arrays.stream(flowRules).forEach(r -> installed.put(r.id(), r));
        }

        @Override
        public void removeFlowRules(FlowRule... flowRules) {
            removed.addAll(Arrays.asList(flowRules));
            Arrays.stream(flowRules).forEach(r -> installed.remove(r.id()));
        }

        @Override
        public Iterable<FlowEntry> getFlowEntriesById(ApplicationId id) {
            return installed.values().stream().filter(r -> r.appId() == id.id())
                    .map(DefaultFlowEntry::new).collect(Collectors.toList());
        }

        @Override
        public Iterable<FlowEntry> getFlowEntries(DeviceId deviceId) {
            return installed.values().stream().filter(r -> r.deviceId().equals(deviceId))
                    .map(DefaultFlowEntry::new).collect(Collectors.toList());
        }

        /** Rules that reach the switches without the manager (another node's, or left by a crash). */
        public void install(FlowRule... flowRules) {
            Arrays.stream(flowRules).forEach(r -> installed.put(r.id(), r));
        }

        /** The switches lose every rule (a new test flow rule service: nothing was written). */
        public void wipe() {
            installed.clear();
        }

        @Override
        public void removeFlowRulesById(ApplicationId id) {
            removedByApp.add(id);
            installed.values().removeIf(r -> r.appId() == id.id());
        }

        /** The rules on the switches now, in the order first applied. */
        public List<FlowRule> installed() {
            return List.copyOf(installed.values());
        }

        /** The rules on the switches now in one table. */
        public List<FlowRule> installed(TableId table) {
            return installed.values().stream().filter(r -> r.table().equals(table)).collect(Collectors.toList());
        }
    }
}
