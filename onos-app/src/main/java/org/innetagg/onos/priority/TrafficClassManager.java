package org.innetagg.onos.priority;

import org.innetagg.onos.aggregation.AggregationManager;
import org.innetagg.onos.aggregation.InvalidPlacementException;
import org.innetagg.onos.aggregation.EntryReconciler;
import org.innetagg.onos.aggregation.JobNumberService;
import org.innetagg.onos.pipeconf.PipeconfLoader;
import org.onosproject.core.ApplicationId;
import org.onosproject.core.CoreService;
import org.onosproject.net.Device;
import org.onosproject.net.DeviceId;
import org.onosproject.net.device.DeviceService;
import org.onosproject.mastership.MastershipEvent;
import org.onosproject.mastership.MastershipListener;
import org.onosproject.mastership.MastershipService;
import org.onosproject.net.flow.FlowRule;
import org.onosproject.net.flow.FlowRuleService;
import org.onosproject.net.pi.service.PiPipeconfService;
import org.onosproject.store.serializers.KryoNamespaces;
import org.onosproject.store.service.ConsistentMap;
import org.onosproject.store.service.Serializer;
import org.onosproject.store.service.StorageService;
import org.onosproject.store.service.Versioned;
import org.osgi.service.component.annotations.Activate;
import org.osgi.service.component.annotations.Component;
import org.osgi.service.component.annotations.Deactivate;
import org.osgi.service.component.annotations.Reference;
import org.osgi.service.component.annotations.ReferenceCardinality;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashSet;
import java.util.List;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.Executor;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.Executors;
import java.util.function.Predicate;
import java.util.stream.Collectors;
import java.util.stream.StreamSupport;

import static org.innetagg.onos.aggregation.JobNumberService.Holder.TRAFFIC_CLASS;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_TRAFFIC_CLASS_TRAFFIC_CLASS;
import static org.onlab.util.Tools.groupedThreads;

/**
 * Keeps each job's traffic class and its traffic_class entries, one per switch. The classes
 * are desired state in a consistent map of ONOS's distributed store ({@link StoredClass}),
 * written before the entries and reconciled into them on activation and when this node
 * becomes a device's master, like the aggregation placements (see
 * {@link AggregationManager} for the order of writes and what two nodes changing one job at
 * once do); the job's number is shared with them through {@link JobNumberService}.
 */
@Component(immediate = true, service = TrafficClassService.class)
public class TrafficClassManager implements TrafficClassService {

    static final String MAP = "innet-agg-traffic-classes";
    /** Classes by job, on top of ONOS's API namespace. */
    public static final Serializer SERIALIZER = Serializer.using(KryoNamespaces.API, StoredClass.class);

    private final Logger log = LoggerFactory.getLogger(getClass());

    @Reference(cardinality = ReferenceCardinality.MANDATORY)
    protected CoreService coreService;
    @Reference(cardinality = ReferenceCardinality.MANDATORY)
    protected DeviceService deviceService;
    @Reference(cardinality = ReferenceCardinality.MANDATORY)
    protected PiPipeconfService pipeconfService;
    @Reference(cardinality = ReferenceCardinality.MANDATORY)
    protected FlowRuleService flowRuleService;
    @Reference(cardinality = ReferenceCardinality.MANDATORY)
    protected JobNumberService jobNumbers;
    @Reference(cardinality = ReferenceCardinality.MANDATORY)
    protected StorageService storageService;
    @Reference(cardinality = ReferenceCardinality.MANDATORY)
    protected MastershipService mastershipService;

    protected ApplicationId appId;
    /** Where mastership changes are reconciled, off ONOS's event thread (tests run it inline). */
    protected Executor reconciler;
    private ScheduledExecutorService ownReconciler;
    private final EntryReconciler entries = new EntryReconciler(
            "traffic_class", INGRESS_PIPE_TRAFFIC_CLASS_TRAFFIC_CLASS, () -> appId, () -> flowRuleService, () -> deviceService, log);
    private ConsistentMap<String, StoredClass> jobs;
    private final MastershipListener mastershipListener = event -> {
        if (event.type() == MastershipEvent.Type.MASTER_CHANGED
                && mastershipService.isLocalMaster(event.subject())) {
            reconciler.execute(EntryReconciler.guarded(() -> reconcile(Set.of(event.subject())::contains), log));
        }
    };

    @Activate
    protected void activate() {
        appId = coreService.registerApplication(AggregationManager.APP_NAME, this::appDeactivating);
        jobs = storageService.<String, StoredClass>consistentMapBuilder()
                .withName(MAP)
                .withSerializer(SERIALIZER)
                .build();
        if (reconciler == null) {
            ownReconciler = Executors.newSingleThreadScheduledExecutor(
                    groupedThreads("innet-agg", "classes-%d", log));
            reconciler = ownReconciler;
            // Anti-entropy: the devices this node masters, whatever happened since (a pass
            // that could not read a device, an event that never came, an entry removed).
            ownReconciler.scheduleWithFixedDelay(
                    EntryReconciler.guarded(() -> reconcile(mastershipService::isLocalMaster), log),
                    EntryReconciler.PERIOD_S, EntryReconciler.PERIOD_S, TimeUnit.SECONDS);
        }
        mastershipService.addListener(mastershipListener);
        reconcile(d -> true);
        log.info("Started with {} classes", jobs.size());
    }

    /** This node stops: the classes and their entries stay, as the placements do. */
    @Deactivate
    protected void deactivate() {
        mastershipService.removeListener(mastershipListener);
        if (ownReconciler != null) {
            ownReconciler.shutdownNow();
            ownReconciler = null;
            reconciler = null;
        }
        log.info("Stopped");
    }

    /**
     * The app is deactivated: removes the entries of the stored classes. The aggregation
     * manager removes every entry of the app then; this one removes its own only, so that it
     * never takes away entries another component of the app still accounts for.
     */
    protected synchronized void appDeactivating() {
        FlowRule[] written = jobs.values().stream().flatMap(v -> v.value().rules(appId).stream())
                .toArray(FlowRule[]::new);
        if (written.length > 0) {
            flowRuleService.removeFlowRules(written);
        }
        jobs.clear();
        jobNumbers.releaseAll(TRAFFIC_CLASS);
    }

    @Override
    public synchronized AppliedClass apply(JobClass jobClass) throws InvalidPlacementException {
        List<DeviceId> devices = jobClass.switches.isPresent()
                ? listedSwitches(jobClass.switches.get()) : ourAvailableSwitches();
        int number = jobNumbers.acquire(jobClass.jobId, TRAFFIC_CLASS);
        for (;;) {
            StoredClass record = new StoredClass(jobClass, number, devices);
            Versioned<StoredClass> previous = jobs.get(jobClass.jobId);
            if (!(previous == null ? jobs.putIfAbsent(jobClass.jobId, record) == null
                    : jobs.replace(jobClass.jobId, previous.version(), record))) {
                continue;
            }
            // As AggregationManager#apply: a DELETE elsewhere may have let the number go.
            int held = jobNumbers.acquire(jobClass.jobId, TRAFFIC_CLASS);
            if (held != number) {
                number = held;
                continue;
            }
            List<FlowRule> rules = record.rules(appId);
            List<FlowRule> before = previous == null ? List.of() : previous.value().rules(appId);
            // One entry per job and switch, same match: a switch still listed gets its entry
            // rewritten (same flow id) by the apply below; only the others are removed.
            Set<DeviceId> still = Set.copyOf(devices);
            FlowRule[] stale = before.stream().filter(r -> !still.contains(r.deviceId())).toArray(FlowRule[]::new);
            if (stale.length > 0) {
                flowRuleService.removeFlowRules(stale);
            }
            if (!rules.isEmpty()) {
                flowRuleService.applyFlowRules(rules.toArray(new FlowRule[0]));
            }
            settle(jobClass.jobId, record, rules, before);
            return record.applied(appId, previous == null);
        }
    }

    @Override
    public Optional<AppliedClass> get(String jobId) {
        Versioned<StoredClass> stored = jobs.get(jobId);
        return stored == null ? Optional.empty() : Optional.of(stored.value().applied(appId, false));
    }

    @Override
    public List<AppliedClass> classes() {
        List<AppliedClass> all = new ArrayList<>();
        jobs.values().forEach(v -> all.add(v.value().applied(appId, false)));
        all.sort(Comparator.comparing(a -> a.jobClass.jobId));
        return List.copyOf(all);
    }

    @Override
    public synchronized boolean remove(String jobId) {
        Versioned<StoredClass> stored;
        do {
            stored = jobs.get(jobId);
            if (stored == null) {
                return false;
            }
        } while (!jobs.remove(jobId, stored.version()));
        List<FlowRule> rules = stored.value().rules(appId);
        if (!rules.isEmpty()) {
            flowRuleService.removeFlowRules(rules.toArray(new FlowRule[0]));
        }
        jobNumbers.release(jobId, TRAFFIC_CLASS);
        // Released first, looked for after (AggregationManager#remove).
        if (jobs.get(jobId) != null) {
            try {
                jobNumbers.acquire(jobId, TRAFFIC_CLASS);
            } catch (InvalidPlacementException e) {
                log.warn("{}: class posted again while deleted, and no number is free: {}", jobId, e.getMessage());
            }
            settle(jobId, null, List.of(), rules);
        }
        return true;
    }

    /**
     * The traffic_class entries of this app on the devices {@code which} accepts become those
     * the stored classes need.
     */
    public synchronized void reconcile(Predicate<DeviceId> which) {
        entries.reconcile(which, () -> jobs.values().stream().flatMap(v -> v.value().rules(appId).stream())
                .collect(Collectors.toList()));
    }

    /** As AggregationManager#settle: reconciles the job's switches when another node changed it since. */
    private void settle(String jobId, StoredClass mine, List<FlowRule> written, List<FlowRule> before) {
        Versioned<StoredClass> now = jobs.get(jobId);
        if (now == null ? mine == null : now.value().equals(mine)) {
            return;
        }
        Set<DeviceId> touched = new HashSet<>();
        written.forEach(r -> touched.add(r.deviceId()));
        before.forEach(r -> touched.add(r.deviceId()));
        if (now != null) {
            now.value().rules(appId).forEach(r -> touched.add(r.deviceId()));
        }
        reconcile(touched::contains);
    }

    /**
     * The listed switches, checked: every document error (400) before any unavailable
     * device (503), so that a client retrying on 503 is not sent back a document it must fix.
     */
    private List<DeviceId> listedSwitches(List<String> listed) throws InvalidPlacementException {
        List<DeviceId> devices = new ArrayList<>();
        for (int i = 0; i < listed.size(); i++) {
            String name = listed.get(i);
            String field = "switches[" + i + "]";
            DeviceId device;
            try {
                device = DeviceId.deviceId(name);
            } catch (IllegalArgumentException e) {
                throw new InvalidPlacementException(field, "unknown device '" + name + "'");
            }
            if (deviceService.getDevice(device) == null) {
                throw new InvalidPlacementException(field, "unknown device '" + name + "'");
            }
            if (!runsOurPipeconf(device)) {
                throw new InvalidPlacementException(field, "device '" + name + "' does not run the innet-agg "
                        + "pipeconf (" + PipeconfLoader.PIPECONF_ID + ")");
            }
            devices.add(device);
        }
        for (int i = 0; i < devices.size(); i++) {
            if (!deviceService.isAvailable(devices.get(i))) {
                throw new InvalidPlacementException(503, "switches[" + i + "]",
                        "device '" + listed.get(i) + "' is not available");
            }
        }
        return devices;
    }

    /** Every available device running our pipeconf, by device id. */
    private List<DeviceId> ourAvailableSwitches() {
        return StreamSupport.stream(deviceService.getAvailableDevices().spliterator(), false)
                .map(Device::id)
                .filter(this::runsOurPipeconf)
                .sorted(Comparator.comparing(DeviceId::toString))
                .collect(Collectors.toList());
    }

    private boolean runsOurPipeconf(DeviceId device) {
        return pipeconfService.ofDevice(device).map(PipeconfLoader.PIPECONF_ID::equals).orElse(false);
    }
}
