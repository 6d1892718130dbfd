package org.innetagg.onos.aggregation;

import org.onosproject.core.ApplicationId;
import org.onosproject.net.Device;
import org.onosproject.net.DeviceId;
import org.onosproject.net.device.DeviceService;
import org.onosproject.net.flow.FlowEntry;
import org.onosproject.net.flow.FlowId;
import org.onosproject.net.flow.FlowRule;
import org.onosproject.net.flow.FlowRuleService;
import org.onosproject.net.flow.TableId;
import org.slf4j.Logger;

import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.function.Predicate;
import java.util.function.Supplier;

/**
 * Makes one table's entries of this app on the switches those the desired state needs,
 * device by device: entries no stored record needs are removed, missing or different ones
 * written. Shared by the placements ({@code agg_job}) and the traffic classes.
 *
 * <p>A device whose entries cannot be read is skipped, logged and returned, and the others
 * are still reconciled: after a node dies, reading a device it still masters waits for
 * ONOS's flow store to time out (30 s) and throws, and a pass over every device that gave up
 * there left the devices the survivor had just taken over without their entries. The
 * managers run a pass on the devices this node masters every {@link #PERIOD_S} seconds, so
 * a skipped device, a lost event or an entry removed behind the app's back is repaired.
 *
 * <p>Order: the entries present are read before the desired state, so an entry another
 * node writes meanwhile is never taken for stale (a node writes the record before its
 * entries): what this pass removes, no record read after it needs.
 */
public final class EntryReconciler {
    /** Seconds between two passes over the devices a node masters. */
    public static final long PERIOD_S = 30;

    private final String what;
    private final TableId table;
    private final Supplier<ApplicationId> appId;
    private final Supplier<FlowRuleService> flows;
    private final Supplier<DeviceService> devices;
    private final Logger log;

    /**
     * The services are read when a pass runs (the managers' references are set by OSGi or by
     * tests after construction).
     */
    public EntryReconciler(String what, TableId table, Supplier<ApplicationId> appId,
                           Supplier<FlowRuleService> flows, Supplier<DeviceService> devices, Logger log) {
        this.what = what;
        this.table = table;
        this.appId = appId;
        this.flows = flows;
        this.devices = devices;
        this.log = log;
    }

    /**
     * One pass over the devices {@code which} accepts (known to the device service, or
     * named by a wanted rule); {@code wanted} gives every rule the stored records need.
     *
     * @return the devices whose entries could not be read or written (the next pass retries)
     */
    public Set<DeviceId> reconcile(Predicate<DeviceId> which, Supplier<Collection<FlowRule>> wanted) {
        Set<DeviceId> targets = new HashSet<>();
        for (Device d : devices.get().getDevices()) {
            if (which.test(d.id())) {
                targets.add(d.id());
            }
        }
        wanted.get().forEach(r -> {
            if (which.test(r.deviceId())) {
                targets.add(r.deviceId());
            }
        });
        FlowRuleService service = flows.get();
        short app = appId.get().id();
        Set<DeviceId> failed = new HashSet<>();
        Map<DeviceId, List<FlowEntry>> present = new HashMap<>();
        for (DeviceId id : targets) {
            try {
                List<FlowEntry> mine = new ArrayList<>();
                Iterable<FlowEntry> entries = service.getFlowEntries(id);
                for (FlowEntry e : entries == null ? List.<FlowEntry>of() : entries) {
                    if (e.appId() == app && e.table().equals(table)) {
                        mine.add(e);
                    }
                }
                present.put(id, mine);
            } catch (RuntimeException e) {
                failed.add(id);
                log.warn("Could not read the {} entries of {} ({}); the next pass retries", what, id, e.toString());
            }
        }
        // The records are read again, after the entries, not reused from the first read: a
        // job placed while the entries were being read then has its new entries in both and
        // they are not removed as stale (read once before, they would be, until the next pass).
        Map<DeviceId, Map<FlowId, FlowRule>> want = new HashMap<>();
        for (FlowRule r : wanted.get()) {
            if (present.containsKey(r.deviceId())) {
                want.computeIfAbsent(r.deviceId(), d -> new HashMap<>()).put(r.id(), r);
            }
        }
        int removed = 0;
        int written = 0;
        for (Map.Entry<DeviceId, List<FlowEntry>> device : present.entrySet()) {
            Map<FlowId, FlowRule> missing = want.getOrDefault(device.getKey(), new HashMap<>());
            List<FlowRule> stale = new ArrayList<>();
            for (FlowEntry e : device.getValue()) {
                if (e.state() == FlowEntry.FlowEntryState.PENDING_REMOVE
                        || e.state() == FlowEntry.FlowEntryState.REMOVED) {
                    continue;  // on its way out: a wanted one is written again
                }
                FlowRule rule = missing.get(e.id());
                if (rule == null) {
                    stale.add(e);
                } else if (rule.exactMatch(e)) {
                    missing.remove(e.id());
                }
            }
            try {
                if (!stale.isEmpty()) {
                    service.removeFlowRules(stale.toArray(new FlowRule[0]));
                }
                if (!missing.isEmpty()) {
                    service.applyFlowRules(missing.values().toArray(new FlowRule[0]));
                }
            } catch (RuntimeException e) {
                failed.add(device.getKey());
                log.warn("Could not write the {} entries of {} ({}); the next pass retries",
                         what, device.getKey(), e.toString());
                continue;
            }
            removed += stale.size();
            written += missing.size();
        }
        if (removed + written > 0) {
            log.info("Reconciled {} entries: {} removed, {} written", what, removed, written);
        }
        return failed;
    }

    /** {@code task}, with what it throws logged: a periodic task that throws is never run again. */
    public static Runnable guarded(Runnable task, Logger log) {
        return () -> {
            try {
                task.run();
            } catch (RuntimeException e) {
                log.warn("Reconciling failed; the next pass retries", e);
            }
        };
    }
}
