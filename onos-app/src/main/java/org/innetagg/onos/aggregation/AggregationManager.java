package org.innetagg.onos.aggregation;

import org.onosproject.core.ApplicationId;
import org.onosproject.core.CoreService;
import org.onosproject.net.DeviceId;
import org.onosproject.net.HostId;
import org.onosproject.net.HostLocation;
import org.onosproject.net.Link;
import org.onosproject.net.PortNumber;
import org.onosproject.net.device.DeviceService;
import org.onosproject.mastership.MastershipEvent;
import org.onosproject.mastership.MastershipListener;
import org.onosproject.mastership.MastershipService;
import org.onosproject.net.flow.FlowRule;
import org.onosproject.net.flow.FlowRuleService;
import org.onosproject.net.host.HostService;
import org.onosproject.net.link.LinkService;
import org.onosproject.store.serializers.KryoNamespaces;
import org.onosproject.store.service.ConsistentMap;
import org.onosproject.store.service.DistributedLock;
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
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.Executor;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.Executors;
import java.util.function.Predicate;
import java.util.stream.Collectors;

import static org.innetagg.onos.aggregation.JobNumberService.Holder.AGGREGATION;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_AGGREGATION_AGG_JOB;
import static org.onlab.util.Tools.groupedThreads;

/**
 * Keeps each job's placement and its agg_job entries. The placements are desired state in a
 * consistent map of ONOS's distributed store ({@link StoredPlacement}): every node of a
 * cluster serves the same jobs, and a node that restarts finds them there. Job numbers come
 * from {@link JobNumberService}, shared with the traffic-class resource.
 *
 * <p>Order of writes: the number, then the desired state, then the flow rules (through
 * {@link FlowRuleService}, whose store is ONOS's). A node that dies between the desired state
 * and the rules leaves entries missing or stale; {@link #reconcile} makes the switches'
 * agg_job entries those the stored placements need, on activation (every node) and when this
 * node becomes a device's master. Two nodes changing one job at once: each record is replaced
 * only at the version read (compare-and-set), so each node removes exactly the stale entries
 * of the record it replaced; a node whose record was replaced again before its rules went out
 * reconciles the job's switches, so the last record wins on the switches too.
 *
 * <p>Checks that span jobs (a pool must not overlap another job's on the same switch) are
 * made and acted on under one cluster-wide lock ({@link #LOCK}, ONOS's distributed lock:
 * Atomix frees it when its holder's session ends), so two nodes placing two jobs at once
 * cannot both take the same slots; changes of one job on one node are serialised as
 * before by {@code synchronized}.
 */
@Component(immediate = true, service = AggregationService.class)
public class AggregationManager implements AggregationService {
    public static final String APP_NAME = "org.innetagg.app";

    static final String MAP = "innet-agg-placements";
    static final String LOCK = "innet-agg-placement-changes";
    static final String CLAIMS = "innet-agg-pool-claims";
    /** Placements by job, on top of ONOS's API namespace. */
    public static final Serializer SERIALIZER = Serializer.using(KryoNamespaces.API, StoredPlacement.class);

    private final Logger log = LoggerFactory.getLogger(getClass());

    @Reference(cardinality = ReferenceCardinality.MANDATORY)
    protected CoreService coreService;
    @Reference(cardinality = ReferenceCardinality.MANDATORY)
    protected DeviceService deviceService;
    @Reference(cardinality = ReferenceCardinality.MANDATORY)
    protected LinkService linkService;
    @Reference(cardinality = ReferenceCardinality.MANDATORY)
    protected HostService hostService;
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
            "agg_job", INGRESS_PIPE_AGGREGATION_AGG_JOB, () -> appId, () -> flowRuleService, () -> deviceService, log);
    private ConsistentMap<String, StoredPlacement> jobs;
    private DistributedLock changes;
    private PoolClaims claims;
    private final MastershipListener mastershipListener = event -> {
        if (event.type() == MastershipEvent.Type.MASTER_CHANGED
                && mastershipService.isLocalMaster(event.subject())) {
            reconciler.execute(EntryReconciler.guarded(() -> reconcile(Set.of(event.subject())::contains), log));
        }
    };

    @Activate
    protected void activate() {
        // The hook runs when an operator deactivates or uninstalls the app, not when this node
        // stops: only then are the jobs forgotten and their entries removed.
        appId = coreService.registerApplication(APP_NAME, this::appDeactivating);
        jobs = storageService.<String, StoredPlacement>consistentMapBuilder()
                .withName(MAP)
                .withSerializer(SERIALIZER)
                .build();
        changes = storageService.lockBuilder().withName(LOCK).build().asLock();
        claims = new PoolClaims(storageService.<String, String>consistentMapBuilder()
                .withName(CLAIMS)
                .withSerializer(SERIALIZER)
                .build());
        claimStored();
        if (reconciler == null) {
            ownReconciler = Executors.newSingleThreadScheduledExecutor(
                    groupedThreads("innet-agg", "reconcile-%d", log));
            reconciler = ownReconciler;
            // Anti-entropy: the devices this node masters, whatever happened since (a pass
            // that could not read a device, an event that never came, an entry removed).
            ownReconciler.scheduleWithFixedDelay(
                    EntryReconciler.guarded(() -> reconcile(mastershipService::isLocalMaster), log),
                    EntryReconciler.PERIOD_S, EntryReconciler.PERIOD_S, TimeUnit.SECONDS);
        }
        mastershipService.addListener(mastershipListener);
        reconcile(d -> true);
        log.info("Started with {} placements", jobs.size());
    }

    /**
     * This node stops (ONOS shuts down, or the app is being deactivated: then
     * {@link #appDeactivating} has run first). The placements and their entries stay: they are
     * the cluster's, and this node reconciles them when it starts again.
     */
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

    /** The app is deactivated (on every node): its entries go, and with them the placements. */
    protected synchronized void appDeactivating() {
        // The entries of this app only (agg_job, traffic_class, INT): forwarding rules of
        // intents belong to other apps.
        flowRuleService.removeFlowRulesById(appId);
        jobs.clear();
        claims.clear();
        jobNumbers.releaseAll(AGGREGATION);
    }

    @Override
    public synchronized AppliedPlacement apply(JobPlacement placement) throws InvalidPlacementException {
        changes.lock();
        try {
            return applyLocked(placement);
        } finally {
            changes.unlock();
        }
    }

    private AppliedPlacement applyLocked(JobPlacement placement) throws InvalidPlacementException {
        List<PortNumber> ports = new ArrayList<>();
        for (AggregatorConfig agg : placement.aggregators) {
            DeviceId device;
            try {
                device = DeviceId.deviceId(agg.switchId);
            } catch (IllegalArgumentException e) {
                // Not a URI, or longer than ONOS's 1024 characters: no device can have this id.
                throw new InvalidPlacementException(agg.field("switch"), "unknown device '" + agg.switchId + "'");
            }
            if (deviceService.getDevice(device) == null) {
                throw new InvalidPlacementException(agg.field("switch"), "unknown device '" + agg.switchId + "'");
            }
            if (!deviceService.isAvailable(device)) {
                throw new InvalidPlacementException(503, agg.field("switch"),
                        "device '" + agg.switchId + "' is not available");
            }
            checkPoolFree(placement, agg);
            ports.add(nextHopPort(agg, placement.workerPaths).orElseThrow(() -> new InvalidPlacementException(
                    agg.field("next_hop"), "no link from '" + agg.switchId + "' towards '" + agg.nextHop + "'")));
        }
        // The slots, by compare-and-set on each switch's claims: the check above reads the
        // placements under the lock; this one holds even where two nodes both hold it.
        Versioned<StoredPlacement> was = jobs.get(placement.jobId);
        Map<String, List<PoolClaims.Claim>> before =
                was == null ? Map.of() : PoolClaims.of(was.value().placement());
        claims.set(placement, before, true);
        try {
            return record(placement, ports);
        } catch (InvalidPlacementException | RuntimeException e) {
            Set<String> touched = new HashSet<>(before.keySet());
            touched.addAll(PoolClaims.of(placement).keySet());
            claims.restore(placement.jobId, before, touched);
            throw e;
        }
    }

    private AppliedPlacement record(JobPlacement placement, List<PortNumber> ports) throws InvalidPlacementException {
        // The job's number if it has one (from a previous placement or its traffic class).
        int number = jobNumbers.acquire(placement.jobId, AGGREGATION);
        for (;;) {
            StoredPlacement record = new StoredPlacement(placement, number, ports);
            Versioned<StoredPlacement> previous = jobs.get(placement.jobId);
            if (!(previous == null ? jobs.putIfAbsent(placement.jobId, record) == null
                    : jobs.replace(placement.jobId, previous.version(), record))) {
                continue;
            }
            // Taken again after the write: a DELETE of this job on another node may have let
            // the number go in between (it releases before it looks for a record again).
            int held = jobNumbers.acquire(placement.jobId, AGGREGATION);
            if (held != number) {
                number = held;
                continue;
            }
            List<FlowRule> rules = record.rules(appId);
            if (previous != null) {
                removeStale(previous.value().rules(appId), rules);
            }
            flowRuleService.applyFlowRules(rules.toArray(new FlowRule[0]));
            settle(placement.jobId, record, rules, previous == null ? List.of() : previous.value().rules(appId));
            return record.applied(appId, previous == null);
        }
    }

    @Override
    public Optional<AppliedPlacement> get(String jobId) {
        Versioned<StoredPlacement> stored = jobs.get(jobId);
        return stored == null ? Optional.empty() : Optional.of(stored.value().applied(appId, false));
    }

    @Override
    public List<AppliedPlacement> placements() {
        List<AppliedPlacement> all = new ArrayList<>();
        jobs.values().forEach(v -> all.add(v.value().applied(appId, false)));
        all.sort(Comparator.comparing(a -> a.placement.jobId));
        return List.copyOf(all);
    }

    @Override
    public synchronized boolean remove(String jobId) {
        changes.lock();
        try {
            return removeLocked(jobId);
        } finally {
            changes.unlock();
        }
    }

    private boolean removeLocked(String jobId) {
        Versioned<StoredPlacement> stored;
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
        claims.release(jobId, PoolClaims.of(stored.value().placement()).keySet());
        jobNumbers.release(jobId, AGGREGATION);
        // Released first, looked for after: a placement another node wrote meanwhile keeps a
        // number (its own check after writing, or this one, takes it again).
        Versioned<StoredPlacement> since = jobs.get(jobId);
        if (since != null) {
            try {
                jobNumbers.acquire(jobId, AGGREGATION);
            } catch (InvalidPlacementException e) {
                log.warn("{}: placed again while deleted, and no number is free: {}", jobId, e.getMessage());
            }
            settle(jobId, null, List.of(), rules);
        }
        return true;
    }

    /**
     * The switches' agg_job entries of this app on the devices {@code which} accepts become
     * those the stored placements need: entries no placement needs are removed, missing or
     * different ones written.
     */
    public synchronized void reconcile(Predicate<DeviceId> which) {
        entries.reconcile(which, () -> jobs.values().stream().flatMap(v -> v.value().rules(appId).stream())
                .collect(Collectors.toList()));
    }

    /**
     * After this node wrote {@code mine} (null: removed the job) and its rules: when another
     * node has changed the job since, the rules written here may have overtaken theirs, and
     * the switches of both are reconciled.
     */
    private void settle(String jobId, StoredPlacement mine, List<FlowRule> written, List<FlowRule> before) {
        Versioned<StoredPlacement> now = jobs.get(jobId);
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

    private void removeStale(List<FlowRule> previous, List<FlowRule> rules) {
        FlowRule[] stale = previous.stream()
                .filter(r -> rules.stream().noneMatch(k -> k.exactMatch(r)))
                .toArray(FlowRule[]::new);
        if (stale.length > 0) {
            flowRuleService.removeFlowRules(stale);
        }
    }

    private void checkPoolFree(JobPlacement placement, AggregatorConfig agg) throws InvalidPlacementException {
        for (Versioned<StoredPlacement> stored : jobs.values()) {
            JobPlacement other = stored.value().placement();
            if (other.jobId.equals(placement.jobId)) {
                continue;
            }
            for (AggregatorConfig o : other.aggregators) {
                if (o.switchId.equals(agg.switchId) && o.overlaps(agg)) {
                    throw PoolClaims.refusal(placement, agg.switchId,
                            new PoolClaims.Claim(placement.jobId, agg.poolBase, agg.poolBase + agg.poolSize),
                            new PoolClaims.Claim(other.jobId, o.poolBase, o.poolBase + o.poolSize));
                }
            }
        }
    }

    /**
     * Placements stored before the ledger existed (an upgrade) are claimed, in job order; one
     * that overlaps a claim already made is logged (the optimizer's reconcile re-places it).
     */
    private void claimStored() {
        List<Versioned<StoredPlacement>> all = new ArrayList<>(jobs.values());
        all.sort(Comparator.comparing(v -> v.value().jobId));
        for (Versioned<StoredPlacement> v : all) {
            JobPlacement p = v.value().placement();
            if (PoolClaims.of(p).entrySet().stream().allMatch(e -> !claims.held(e.getKey(), p.jobId).isEmpty())) {
                continue;
            }
            try {
                claims.set(p, Map.of(), true);
            } catch (InvalidPlacementException e) {
                log.error("stored placement of '{}' not claimed: {}", p.jobId, e.getMessage());
            }
        }
    }

    /**
     * The switch's port towards its next hop: the first link of a pinned worker path from
     * this switch onwards when a path crosses it, else a direct link (or host attachment) to
     * {@code next_hop}.
     */
    Optional<PortNumber> nextHopPort(AggregatorConfig agg, Map<String, List<String>> workerPaths) {
        DeviceId here = DeviceId.deviceId(agg.switchId);
        for (List<String> path : workerPaths.values()) {
            int at = path.indexOf(agg.switchId);
            if (at >= 0 && at + 1 < path.size() && path.subList(at + 1, path.size()).contains(agg.nextHop)) {
                Optional<PortNumber> port = portTowards(here, path.get(at + 1));
                if (port.isPresent()) {
                    return port;
                }
            }
        }
        return portTowards(here, agg.nextHop);
    }

    private Optional<PortNumber> portTowards(DeviceId here, String neighbour) {
        for (Link link : linkService.getDeviceEgressLinks(here)) {
            if (link.dst().elementId().toString().equals(neighbour)) {
                return Optional.of(link.src().port());
            }
        }
        HostId hostId;
        try {
            hostId = HostId.hostId(neighbour);
        } catch (IllegalArgumentException e) {
            return Optional.empty();
        }
        var host = hostService.getHost(hostId);
        if (host == null) {
            return Optional.empty();
        }
        return host.locations().stream()
                .filter(l -> l.deviceId().equals(here))
                .map(HostLocation::port)
                .findFirst();
    }
}
