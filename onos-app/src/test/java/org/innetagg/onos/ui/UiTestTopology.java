package org.innetagg.onos.ui;

import org.innetagg.onos.TestElements;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.innetagg.onos.aggregation.AggregationService;
import org.innetagg.onos.aggregation.AppliedPlacement;
import org.innetagg.onos.aggregation.JobPlacement;
import org.onlab.osgi.TestServiceDirectory;
import org.onosproject.net.ConnectPoint;
import org.onosproject.net.DefaultEdgeLink;
import org.onosproject.net.DefaultPath;
import org.onosproject.net.Device;
import org.onosproject.net.DeviceId;
import org.onosproject.net.ElementId;
import org.onosproject.net.Host;
import org.onosproject.net.HostId;
import org.onosproject.net.Link;
import org.onosproject.net.Path;
import org.onosproject.net.PortNumber;
import org.onosproject.net.device.DeviceService;
import org.onosproject.net.device.DeviceServiceAdapter;
import org.onosproject.net.host.HostService;
import org.onosproject.net.host.HostServiceAdapter;
import org.onosproject.net.link.LinkService;
import org.onosproject.net.link.LinkServiceAdapter;
import org.onosproject.net.topology.PathService;
import org.onosproject.net.topology.PathServiceAdapter;
import org.onosproject.ui.UiConnection;
import org.onosproject.ui.model.topo.UiTopoLayout;

import java.io.InputStream;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.TreeMap;
import java.util.stream.Collectors;

import static org.innetagg.onos.TestElements.PID;
import static org.innetagg.onos.TestElements.host;
import static org.innetagg.onos.TestElements.link;
import static org.onlab.graph.ScalarWeight.toWeight;

/**
 * Two leaves, two spines (equal-cost paths leaf1-leaf2), hosts 01 and 02 on leaf1, 03, 04 and
 * FE:..:05 on leaf2 (placements/ui/unpinned.json spells it in lower case, ONOS in upper).
 * The device and host ids of src/test/resources/placements/valid.json and placements/ui/.
 */
final class UiTestTopology {
    static final DeviceId LEAF1 = DeviceId.deviceId("device:leaf1");
    static final DeviceId LEAF2 = DeviceId.deviceId("device:leaf2");
    static final DeviceId SPINE1 = DeviceId.deviceId("device:spine1");
    static final DeviceId SPINE2 = DeviceId.deviceId("device:spine2");
    static final HostId H1 = HostId.hostId("00:00:00:00:00:01/None");
    static final HostId H2 = HostId.hostId("00:00:00:00:00:02/None");
    static final HostId H3 = HostId.hostId("00:00:00:00:00:03/None");
    static final HostId H4 = HostId.hostId("00:00:00:00:00:04/None");
    static final HostId H5 = HostId.hostId("fe:00:00:00:00:05/None");

    static final Map<DeviceId, Device> DEVICES = List.of(LEAF1, LEAF2, SPINE1, SPINE2).stream()
            .collect(Collectors.toMap(d -> d, TestElements::device));
    static final List<Link> LINKS = List.of(
            link(LEAF1, 2, SPINE1, 1), link(SPINE1, 1, LEAF1, 2),
            link(SPINE1, 2, LEAF2, 3), link(LEAF2, 3, SPINE1, 2),
            link(LEAF1, 5, SPINE2, 1), link(SPINE2, 1, LEAF1, 5),
            link(SPINE2, 2, LEAF2, 5), link(LEAF2, 5, SPINE2, 2));
    static final Map<HostId, Host> HOSTS = Map.of(
            H1, host(H1, LEAF1, 1), H2, host(H2, LEAF1, 4),
            H3, host(H3, LEAF2, 2), H4, host(H4, LEAF2, 1),
            H5, host(H5, LEAF2, 6));

    private UiTestTopology() {
    }

    static final DeviceService DEVICE_SERVICE = new DeviceServiceAdapter() {
        @Override
        public Device getDevice(DeviceId id) {
            return DEVICES.get(id);
        }
    };

    static final HostService HOST_SERVICE = new HostServiceAdapter() {
        @Override
        public Host getHost(HostId id) {
            return HOSTS.get(id);
        }
    };

    static final LinkService LINK_SERVICE = new LinkServiceAdapter() {
        @Override
        public Set<Link> getDeviceEgressLinks(DeviceId id) {
            return LINKS.stream().filter(l -> l.src().deviceId().equals(id)).collect(Collectors.toSet());
        }
    };

    /**
     * Every shortest path, as ONOS's PathManager answers: infrastructure links, with edge
     * links added when an end is a host. A stand-in (no ONOS core runs here).
     */
    static final class ShortestPaths extends PathServiceAdapter {
        int calls;

        @Override
        public Set<Path> getPaths(ElementId src, ElementId dst) {
            calls++;
            List<List<Link>> found = new ArrayList<>();
            List<Link> start = new ArrayList<>();
            ElementId from = src;
            if (src instanceof HostId) {
                Host h = HOSTS.get(src);
                start.add(new DefaultEdgeLink(PID, new ConnectPoint(src, PortNumber.P0), h.location(), true));
                from = h.location().deviceId();
            }
            ElementId to = dst instanceof HostId ? HOSTS.get(dst).location().deviceId() : dst;
            search((DeviceId) from, (DeviceId) to, start, new HashSet<>(Set.of(from)), found);
            int best = found.stream().mapToInt(List::size).min().orElse(0);
            Set<Path> paths = new HashSet<>();
            for (List<Link> links : found) {
                if (links.size() != best) {
                    continue;
                }
                List<Link> all = new ArrayList<>(links);
                if (dst instanceof HostId) {
                    Host h = HOSTS.get(dst);
                    all.add(new DefaultEdgeLink(PID, new ConnectPoint(dst, PortNumber.P0), h.location(), false));
                }
                if (!all.isEmpty()) {
                    paths.add(new DefaultPath(PID, all, toWeight(all.size())));
                }
            }
            return paths;
        }

        private void search(DeviceId at, DeviceId to, List<Link> sofar, Set<ElementId> seen, List<List<Link>> out) {
            if (at.equals(to)) {
                out.add(new ArrayList<>(sofar));
                return;
            }
            for (Link l : LINK_SERVICE.getDeviceEgressLinks(at)) {
                DeviceId next = l.dst().deviceId();
                if (seen.add(next)) {
                    sofar.add(l);
                    search(next, to, sofar, seen, out);
                    sofar.remove(sofar.size() - 1);
                    seen.remove(next);
                }
            }
        }
    }

    /** Placements held in memory, as the manager would hold them once applied. */
    static final class Placements implements AggregationService {
        final Map<String, AppliedPlacement> jobs = new TreeMap<>();
        RuntimeException failure;

        void put(JobPlacement p) {
            AppliedPlacement before = jobs.get(p.jobId);
            int number = before != null ? before.p4JobId : jobs.size() + 10;
            jobs.put(p.jobId, new AppliedPlacement(p, number, List.of(), before == null));
        }

        @Override
        public AppliedPlacement apply(JobPlacement placement) {
            put(placement);
            return jobs.get(placement.jobId);
        }

        @Override
        public Optional<AppliedPlacement> get(String jobId) {
            return Optional.ofNullable(jobs.get(jobId));
        }

        @Override
        public List<AppliedPlacement> placements() {
            if (failure != null) {
                throw failure;
            }
            return List.copyOf(jobs.values());
        }

        @Override
        public boolean remove(String jobId) {
            return jobs.remove(jobId) != null;
        }
    }

    /** A GUI connection that keeps what is sent to the browser. */
    static final class Browser implements UiConnection {
        final List<ObjectNode> sent = new ArrayList<>();

        @Override
        public String userName() {
            return "test";
        }

        @Override
        public UiTopoLayout currentLayout() {
            return null;
        }

        @Override
        public void setCurrentLayout(UiTopoLayout topoLayout) {
        }

        @Override
        public String currentView() {
            return "topo";
        }

        @Override
        public void setCurrentView(String viewId) {
        }

        @Override
        public void sendMessage(ObjectNode message) {
            sent.add(message);
        }

        @Override
        public void sendMessage(String type, ObjectNode payload) {
            ObjectNode m = new ObjectMapper().createObjectNode().put("event", type);
            m.set("payload", payload);
            sent.add(m);
        }
    }

    static TestServiceDirectory directory(AggregationService aggregation, PathService paths) {
        return new TestServiceDirectory()
                .add(AggregationService.class, aggregation)
                .add(DeviceService.class, DEVICE_SERVICE)
                .add(HostService.class, HOST_SERVICE)
                .add(LinkService.class, LINK_SERVICE)
                .add(PathService.class, paths);
    }

    static JobPlacement fixture(String job, String name) throws Exception {
        try (InputStream in = UiTestTopology.class.getResourceAsStream("/placements/" + name)) {
            return JobPlacement.decode(job, new ObjectMapper().readTree(in));
        }
    }

    /** placements/valid.json under another job id. */
    static JobPlacement validAs(String job) throws Exception {
        ObjectNode doc;
        try (InputStream in = UiTestTopology.class.getResourceAsStream("/placements/valid.json")) {
            doc = (ObjectNode) new ObjectMapper().readTree(in);
        }
        ((ObjectNode) doc.get("jobs").get(0)).put("job_id", job);
        return JobPlacement.decode(job, doc);
    }
}
