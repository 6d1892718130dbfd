package org.innetagg.onos.ui;

import org.innetagg.onos.aggregation.AggregatorConfig;
import org.innetagg.onos.aggregation.AppliedPlacement;
import org.onosproject.net.ConnectPoint;
import org.onosproject.net.DefaultEdgeLink;
import org.onosproject.net.DeviceId;
import org.onosproject.net.ElementId;
import org.onosproject.net.Host;
import org.onosproject.net.HostId;
import org.onosproject.net.HostLocation;
import org.onosproject.net.Link;
import org.onosproject.net.Path;
import org.onosproject.net.PortNumber;
import org.onosproject.net.device.DeviceService;
import org.onosproject.net.host.HostService;
import org.onosproject.net.link.LinkService;
import org.onosproject.net.provider.ProviderId;
import org.onosproject.net.topology.PathService;
import org.onosproject.ui.topo.DeviceHighlight;
import org.onosproject.ui.topo.Highlights;
import org.onosproject.ui.topo.HostHighlight;
import org.onosproject.ui.topo.NodeBadge;
import org.onosproject.ui.topo.PropertyPanel;
import org.onosproject.ui.topo.TopoUtils;

import java.util.ArrayList;
import java.util.Comparator;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Optional;
import java.util.Set;
import java.util.stream.Collectors;

/**
 * What the topology overlay shows of one job: the highlights (aggregation switches with a
 * fan-in badge, worker and PS hosts, the links of the worker → aggregator → PS paths) and
 * the job's panel. Pinned paths of the placement are drawn hop by hop as ONOS knows the
 * links; a worker without one is routed hop to hop (worker, its aggregators, PS) on ONOS's
 * shortest path, which need not be the one its intents use. Nothing is guessed: an element
 * or hop ONOS does not know is listed in the panel, not drawn.
 */
final class JobView {
    static final String GLYPH = "m_topo";
    static final String WORKER_BADGE = "W";
    static final String PS_BADGE = "PS";

    final Highlights highlights;
    final PropertyPanel panel;
    /** Elements and hops of the placement that could not be drawn, with the reason. */
    final List<String> notShown;

    private JobView(Highlights highlights, PropertyPanel panel, List<String> notShown) {
        this.highlights = highlights;
        this.panel = panel;
        this.notShown = List.copyOf(notShown);
    }

    /** The services a view is computed from: ONOS's view of the network. */
    static final class Topology {
        final DeviceService devices;
        final HostService hosts;
        final LinkService links;
        final PathService paths;

        Topology(DeviceService devices, HostService hosts, LinkService links, PathService paths) {
            this.devices = devices;
            this.hosts = hosts;
            this.links = links;
            this.paths = paths;
        }

        /** The device or host a placement names; empty when ONOS knows neither. */
        Optional<ElementId> element(String id) {
            try {
                DeviceId d = DeviceId.deviceId(id);
                if (devices.getDevice(d) != null) {
                    return Optional.of(d);
                }
            } catch (IllegalArgumentException e) {
                // not a URI: cannot be a device id, may still be a host id
            }
            try {
                HostId h = HostId.hostId(id);
                if (hosts.getHost(h) != null) {
                    return Optional.of(h);
                }
            } catch (RuntimeException e) {
                // "h0_0_0" and the like: the simulator's ids, not ONOS's
            }
            return Optional.empty();
        }
    }

    static JobView of(AppliedPlacement applied, Topology topo) {
        JobRoles roles = JobRoles.of(applied.placement);
        List<String> notShown = new ArrayList<>(roles.problems);
        Highlights hl = new Highlights();
        Set<String> badged = new LinkedHashSet<>();

        for (AggregatorConfig a : roles.aggregators.values()) {
            Optional<ElementId> e = topo.element(a.switchId);
            if (e.isPresent() && e.get() instanceof DeviceId) {
                DeviceHighlight dh = new DeviceHighlight(e.get().toString());
                dh.setBadge(NodeBadge.number(NodeBadge.Status.INFO, a.fanIn, aggregatorText(a)));
                hl.add(dh);
                badged.add(e.get().toString());
            } else {
                notShown.add("aggregator " + a.switchId + ": " + (e.isPresent() ? "not a device" : "unknown to ONOS"));
            }
        }
        for (String w : roles.workers) {
            hostHighlight(w, NodeBadge.text(NodeBadge.Status.INFO, WORKER_BADGE, "worker"), "worker", topo, hl,
                          badged, notShown);
        }
        for (String p : roles.parameterServers) {
            hostHighlight(p, NodeBadge.text(NodeBadge.Status.INFO, PS_BADGE, "parameter server"),
                          "parameter server", topo, hl, badged, notShown);
        }

        JobLinkMap linkMap = new JobLinkMap();
        int pinned = 0;
        int routed = 0;
        for (JobRoles.Route route : roles.routes) {
            if (route.pinned) {
                pinned++;
            } else {
                routed++;
            }
            for (int i = 0; i + 1 < route.nodes.size(); i++) {
                String from = route.nodes.get(i);
                String to = route.nodes.get(i + 1);
                Optional<ElementId> a = topo.element(from);
                Optional<ElementId> b = topo.element(to);
                if (a.isEmpty() || b.isEmpty() || a.get().equals(b.get())) {
                    continue; // an unknown end is listed above; a node repeated is no hop
                }
                List<Link> links = route.pinned ? hop(a.get(), b.get(), topo) : shortestPath(a.get(), b.get(), topo);
                if (links.isEmpty()) {
                    String why = route.pinned ? "no link in ONOS" : "no path in ONOS";
                    String hop = "hop " + from + " → " + to + ": " + why;
                    if (!notShown.contains(hop)) {
                        notShown.add(hop);
                    }
                }
                links.forEach(linkMap::add);
            }
        }
        for (JobLinkMap.JobLink link : linkMap.biLinks()) {
            hl.add(link.highlight(null));
            // Switches the paths cross without aggregating stay visible, without a badge.
            for (ElementId end : List.of(link.one().src().elementId(), link.one().dst().elementId())) {
                if (end instanceof DeviceId && !badged.contains(end.toString())
                        && hl.getDevice(end.toString()) == null) {
                    hl.add(new DeviceHighlight(end.toString()));
                }
            }
        }
        hl.subdueAllElse(Highlights.Amount.MINIMALLY);
        return new JobView(hl, panel(applied, roles, pinned, routed, notShown), notShown);
    }

    private static void hostHighlight(String id, NodeBadge badge, String role, Topology topo, Highlights hl,
                                      Set<String> badged, List<String> notShown) {
        Optional<ElementId> e = topo.element(id);
        if (e.isPresent() && e.get() instanceof HostId) {
            HostHighlight hh = new HostHighlight(e.get().toString());
            hh.setBadge(badge);
            hl.add(hh);
            badged.add(e.get().toString());
        } else {
            notShown.add(role + " " + id + ": " + (e.isPresent() ? "not a host" : "unknown to ONOS"));
        }
    }

    static String aggregatorText(AggregatorConfig a) {
        return "fan-in " + a.fanIn + ", slots [" + a.poolBase + ", " + (a.poolBase + a.poolSize) + ") → "
                + a.nextHop;
    }

    /** The link(s) between two nodes a pinned path names as adjacent. */
    private static List<Link> hop(ElementId a, ElementId b, Topology topo) {
        if (a instanceof HostId && b instanceof DeviceId) {
            return edge((HostId) a, (DeviceId) b, true, topo);
        }
        if (a instanceof DeviceId && b instanceof HostId) {
            return edge((HostId) b, (DeviceId) a, false, topo);
        }
        if (a instanceof DeviceId && b instanceof DeviceId) {
            return topo.links.getDeviceEgressLinks((DeviceId) a).stream()
                    .filter(l -> l.dst().deviceId().equals(b))
                    .min(Comparator.comparing(TopoUtils::compactLinkString))
                    .map(List::of).orElse(List.of());
        }
        return List.of();
    }

    private static List<Link> edge(HostId host, DeviceId device, boolean ingress, Topology topo) {
        Host h = topo.hosts.getHost(host);
        if (h == null) {
            return List.of();
        }
        for (HostLocation loc : h.locations()) {
            if (loc.deviceId().equals(device)) {
                return List.of(new DefaultEdgeLink(ProviderId.NONE, new ConnectPoint(host, PortNumber.P0), loc,
                                                   ingress));
            }
        }
        return List.of();
    }

    /**
     * One of ONOS's shortest paths; among equals the first by link ids, so that a refresh
     * does not flip between equal-cost paths.
     */
    private static List<Link> shortestPath(ElementId a, ElementId b, Topology topo) {
        Set<Path> paths = topo.paths.getPaths(a, b);
        if (paths == null) {
            return List.of();
        }
        return paths.stream()
                .min(Comparator.<Path>comparingInt(p -> p.links().size())
                             .thenComparing(p -> p.links().stream().map(TopoUtils::compactLinkString)
                                     .collect(Collectors.joining(","))))
                .map(Path::links).orElse(List.of());
    }

    private static PropertyPanel panel(AppliedPlacement applied, JobRoles roles, int pinned, int routed,
                                       List<String> notShown) {
        PropertyPanel pp = new PropertyPanel(applied.placement.jobId, GLYPH).id(applied.placement.jobId);
        pp.addProp("p4JobId", "P4 job id", applied.p4JobId)
                .addProp("workers", "Workers", roles.workers.size())
                .addProp("ps", "Parameter server", String.join(", ", roles.parameterServers))
                .addProp("aggregators", "Aggregators", roles.aggregators.size())
                .addProp("paths", "Paths", pathsText(pinned, routed));
        pp.addSeparator();
        int i = 0;
        for (AggregatorConfig a : roles.aggregators.values()) {
            pp.addProp("agg" + i++, a.switchId, aggregatorText(a));
        }
        if (!notShown.isEmpty()) {
            pp.addSeparator();
            for (int n = 0; n < notShown.size(); n++) {
                pp.addProp("notShown" + n, "Not shown", notShown.get(n));
            }
        }
        return pp;
    }

    private static String pathsText(int pinned, int routed) {
        if (routed == 0) {
            return pinned + " pinned";
        }
        String shortest = routed + " by ONOS's shortest path";
        return pinned == 0 ? shortest : pinned + " pinned, " + shortest;
    }
}
