package org.innetagg.onos.aggregation;

import org.onosproject.core.ApplicationId;
import org.onosproject.core.CoreService;
import org.onosproject.net.DeviceId;
import org.onosproject.net.HostId;
import org.onosproject.net.HostLocation;
import org.onosproject.net.Link;
import org.onosproject.net.PortNumber;
import org.onosproject.net.device.DeviceService;
import org.onosproject.net.flow.FlowRule;
import org.onosproject.net.flow.FlowRuleService;
import org.onosproject.net.host.HostService;
import org.onosproject.net.link.LinkService;
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
import java.util.concurrent.ConcurrentHashMap;

import static org.innetagg.onos.aggregation.JobNumberService.Holder.AGGREGATION;

/**
 * Keeps each job's placement and its agg_job entries. State is in memory on the instance
 * that served the request (single-instance ONOS; a cluster would need a distributed store).
 * Job numbers come from {@link JobNumberService}, shared with the traffic-class resource.
 */
@Component(immediate = true, service = AggregationService.class)
public class AggregationManager implements AggregationService {
    public static final String APP_NAME = "org.innetagg.app";

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

    protected ApplicationId appId;
    private final Map<String, AppliedPlacement> jobs = new ConcurrentHashMap<>();

    @Activate
    protected void activate() {
        appId = coreService.registerApplication(APP_NAME);
        log.info("Started");
    }

    @Deactivate
    protected void deactivate() {
        // The entries of this app only (agg_job, traffic_class, INT): forwarding rules of
        // intents belong to other apps.
        flowRuleService.removeFlowRulesById(appId);
        jobs.clear();
        jobNumbers.releaseAll(AGGREGATION);
        log.info("Stopped");
    }

    @Override
    public synchronized AppliedPlacement apply(JobPlacement placement) throws InvalidPlacementException {
        AppliedPlacement previous = jobs.get(placement.jobId);
        List<DeviceId> devices = new ArrayList<>();
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
            checkPoolFree(placement.jobId, agg);
            devices.add(device);
            ports.add(nextHopPort(agg, placement.workerPaths).orElseThrow(() -> new InvalidPlacementException(
                    agg.field("next_hop"), "no link from '" + agg.switchId + "' towards '" + agg.nextHop + "'")));
        }
        // The job's number if it has one (from a previous placement or its traffic class).
        int number = jobNumbers.acquire(placement.jobId, AGGREGATION);
        List<FlowRule> rules = new ArrayList<>();
        for (int i = 0; i < devices.size(); i++) {
            rules.add(AggregationTranslator.aggJobRule(appId, devices.get(i), number,
                    placement.aggregators.get(i), ports.get(i)));
        }
        if (previous != null) {
            Set<FlowRule> keep = new HashSet<>(rules);
            FlowRule[] stale = previous.rules.stream()
                    .filter(r -> keep.stream().noneMatch(k -> k.exactMatch(r)))
                    .toArray(FlowRule[]::new);
            if (stale.length > 0) {
                flowRuleService.removeFlowRules(stale);
            }
        }
        flowRuleService.applyFlowRules(rules.toArray(new FlowRule[0]));
        AppliedPlacement applied = new AppliedPlacement(placement, number, rules, previous == null);
        jobs.put(placement.jobId, applied);
        return applied;
    }

    @Override
    public Optional<AppliedPlacement> get(String jobId) {
        return Optional.ofNullable(jobs.get(jobId));
    }

    @Override
    public List<AppliedPlacement> placements() {
        List<AppliedPlacement> all = new ArrayList<>(jobs.values());
        all.sort(Comparator.comparing(a -> a.placement.jobId));
        return List.copyOf(all);
    }

    @Override
    public synchronized boolean remove(String jobId) {
        AppliedPlacement applied = jobs.remove(jobId);
        if (applied == null) {
            return false;
        }
        if (!applied.rules.isEmpty()) {
            flowRuleService.removeFlowRules(applied.rules.toArray(new FlowRule[0]));
        }
        jobNumbers.release(jobId, AGGREGATION);
        return true;
    }

    private void checkPoolFree(String jobId, AggregatorConfig agg) throws InvalidPlacementException {
        for (AppliedPlacement other : jobs.values()) {
            if (other.placement.jobId.equals(jobId)) {
                continue;
            }
            for (AggregatorConfig o : other.placement.aggregators) {
                if (o.switchId.equals(agg.switchId) && o.overlaps(agg)) {
                    throw new InvalidPlacementException(agg.field("pool"), "slots [" + agg.poolBase + ", "
                            + (agg.poolBase + agg.poolSize) + ") overlap job '" + other.placement.jobId
                            + "' on '" + agg.switchId + "'");
                }
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
