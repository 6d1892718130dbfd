package org.innetagg.onos.priority;

import org.innetagg.onos.aggregation.AggregationManager;
import org.innetagg.onos.aggregation.InvalidPlacementException;
import org.innetagg.onos.aggregation.JobNumberService;
import org.innetagg.onos.pipeconf.PipeconfLoader;
import org.onosproject.core.ApplicationId;
import org.onosproject.core.CoreService;
import org.onosproject.net.Device;
import org.onosproject.net.DeviceId;
import org.onosproject.net.device.DeviceService;
import org.onosproject.net.flow.FlowRule;
import org.onosproject.net.flow.FlowRuleService;
import org.onosproject.net.pi.service.PiPipeconfService;
import org.osgi.service.component.annotations.Activate;
import org.osgi.service.component.annotations.Component;
import org.osgi.service.component.annotations.Deactivate;
import org.osgi.service.component.annotations.Reference;
import org.osgi.service.component.annotations.ReferenceCardinality;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.stream.Collectors;
import java.util.stream.StreamSupport;

import static org.innetagg.onos.aggregation.JobNumberService.Holder.TRAFFIC_CLASS;

/**
 * Keeps each job's traffic class and its traffic_class entries, one per switch. State is in
 * memory on this instance, like the aggregation placements; the job's number is shared with
 * them through {@link JobNumberService}.
 */
@Component(immediate = true, service = TrafficClassService.class)
public class TrafficClassManager implements TrafficClassService {

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

    protected ApplicationId appId;
    private final Map<String, AppliedClass> jobs = new ConcurrentHashMap<>();

    @Activate
    protected void activate() {
        appId = coreService.registerApplication(AggregationManager.APP_NAME);
        log.info("Started");
    }

    /**
     * Removes the entries this component wrote. The aggregation manager removes every entry
     * of the app when the app is deactivated; this one removes its own only, so that it never
     * takes away entries another component of the app still accounts for.
     */
    @Deactivate
    protected synchronized void deactivate() {
        FlowRule[] written = jobs.values().stream().flatMap(a -> a.rules.stream()).toArray(FlowRule[]::new);
        if (written.length > 0) {
            flowRuleService.removeFlowRules(written);
        }
        jobs.clear();
        jobNumbers.releaseAll(TRAFFIC_CLASS);
        log.info("Stopped");
    }

    @Override
    public synchronized AppliedClass apply(JobClass jobClass) throws InvalidPlacementException {
        AppliedClass previous = jobs.get(jobClass.jobId);
        List<DeviceId> devices = jobClass.switches.isPresent()
                ? listedSwitches(jobClass.switches.get()) : ourAvailableSwitches();
        int number = jobNumbers.acquire(jobClass.jobId, TRAFFIC_CLASS);
        List<FlowRule> rules = devices.stream()
                .map(d -> TrafficClassTranslator.classRule(appId, d, number, jobClass.priorityClass))
                .collect(Collectors.toList());
        if (previous != null) {
            // One entry per job and switch, same match: a switch still listed gets its entry
            // rewritten (same flow id) by the apply below; only the others are removed.
            Set<DeviceId> still = Set.copyOf(devices);
            FlowRule[] stale = previous.rules.stream()
                    .filter(r -> !still.contains(r.deviceId()))
                    .toArray(FlowRule[]::new);
            if (stale.length > 0) {
                flowRuleService.removeFlowRules(stale);
            }
        }
        if (!rules.isEmpty()) {
            flowRuleService.applyFlowRules(rules.toArray(new FlowRule[0]));
        }
        AppliedClass applied = new AppliedClass(jobClass, number, devices, rules, previous == null);
        jobs.put(jobClass.jobId, applied);
        return applied;
    }

    @Override
    public Optional<AppliedClass> get(String jobId) {
        return Optional.ofNullable(jobs.get(jobId));
    }

    @Override
    public List<AppliedClass> classes() {
        List<AppliedClass> all = new ArrayList<>(jobs.values());
        all.sort(Comparator.comparing(a -> a.jobClass.jobId));
        return List.copyOf(all);
    }

    @Override
    public synchronized boolean remove(String jobId) {
        AppliedClass applied = jobs.remove(jobId);
        if (applied == null) {
            return false;
        }
        if (!applied.rules.isEmpty()) {
            flowRuleService.removeFlowRules(applied.rules.toArray(new FlowRule[0]));
        }
        jobNumbers.release(jobId, TRAFFIC_CLASS);
        return true;
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
