package org.innetagg.onos.ui;

import org.innetagg.onos.aggregation.AggregatorConfig;
import org.innetagg.onos.aggregation.JobPlacement;
import org.onosproject.net.HostId;

import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * Who is what in a job's placement document (docs/documents.md), without the topology.
 * The document names no workers and no PS directly: workers are the keys of
 * {@code worker_paths} and the children of aggregators that are not aggregators themselves;
 * the PS is where the paths end and where the root aggregator sends its sum.
 */
final class JobRoles {
    /** Aggregation switches, in document order, with their aggregator. */
    final Map<String, AggregatorConfig> aggregators;
    final Set<String> workers;
    final Set<String> parameterServers;
    /** Node sequences to draw: the pinned paths, then chains of hops to be routed by ONOS. */
    final List<Route> routes;
    /** Problems of the document itself (an aggregation loop), shown next to the job. */
    final List<String> problems;

    /** One drawn route: pinned (adjacent nodes) or a chain whose hops ONOS routes. */
    static final class Route {
        final List<String> nodes;
        final boolean pinned;

        Route(List<String> nodes, boolean pinned) {
            this.nodes = List.copyOf(nodes);
            this.pinned = pinned;
        }
    }

    private JobRoles(Map<String, AggregatorConfig> aggregators, Set<String> workers, Set<String> parameterServers,
                     List<Route> routes, List<String> problems) {
        this.aggregators = Collections.unmodifiableMap(aggregators);
        this.workers = Collections.unmodifiableSet(workers);
        this.parameterServers = Collections.unmodifiableSet(parameterServers);
        this.routes = List.copyOf(routes);
        this.problems = List.copyOf(problems);
    }

    static JobRoles of(JobPlacement placement) {
        Map<String, AggregatorConfig> aggs = new LinkedHashMap<>();
        placement.aggregators.forEach(a -> aggs.put(a.switchId, a));

        // JobPlacement keeps worker_paths in a Map.copyOf (no order): sort for stable output.
        List<String> pinnedWorkers = new ArrayList<>(placement.workerPaths.keySet());
        Collections.sort(pinnedWorkers);
        Set<String> workers = new LinkedHashSet<>(pinnedWorkers);
        for (AggregatorConfig a : aggs.values()) {
            a.children.stream().filter(c -> !aggs.containsKey(c)).forEach(workers::add);
        }

        Set<String> ps = new LinkedHashSet<>();
        List<Route> routes = new ArrayList<>();
        List<String> problems = new ArrayList<>();
        Set<String> routed = new LinkedHashSet<>();
        for (String w : pinnedWorkers) {
            List<String> path = placement.workerPaths.get(w);
            if (!path.isEmpty()) {
                ps.add(path.get(path.size() - 1));
                routes.add(new Route(path, true));
                routed.addAll(path);
            }
        }
        for (String w : workers) {
            if (placement.workerPaths.containsKey(w)) {
                continue;
            }
            List<String> chain = new ArrayList<>();
            chain.add(w);
            aggs.values().stream().filter(a -> a.children.contains(w)).findFirst()
                    .ifPresent(first -> follow(first, aggs, chain, ps, problems));
            routes.add(new Route(chain, false));
            routed.addAll(chain);
        }
        // An aggregator no worker reaches (no children listed) still sends its sum on.
        for (AggregatorConfig a : aggs.values()) {
            if (!routed.contains(a.switchId)) {
                List<String> chain = new ArrayList<>();
                follow(a, aggs, chain, ps, problems);
                routes.add(new Route(chain, false));
                routed.addAll(chain);
            }
        }
        aggs.values().stream().map(a -> a.nextHop).filter(n -> !aggs.containsKey(n)).forEach(ps::add);
        workers.removeAll(ps);
        return new JobRoles(aggs, workers, ps, routes, problems);
    }

    /** Appends {@code from} and the next hops after it up to the first node that does not aggregate. */
    private static void follow(AggregatorConfig from, Map<String, AggregatorConfig> aggs, List<String> chain,
                               Set<String> ps, List<String> problems) {
        Set<String> seen = new LinkedHashSet<>();
        AggregatorConfig at = from;
        while (true) {
            chain.add(at.switchId);
            seen.add(at.switchId);
            AggregatorConfig next = aggs.get(at.nextHop);
            if (next == null) {
                chain.add(at.nextHop);
                ps.add(at.nextHop);
                return;
            }
            if (seen.contains(next.switchId)) {
                String loop = "next_hop loop: " + String.join(" → ", seen) + " → " + next.switchId;
                if (!problems.contains(loop)) {
                    problems.add(loop);
                }
                return;
            }
            at = next;
        }
    }

    /** The role of a host in this job, for its details panel; null when it has none. */
    String roleOf(HostId host) {
        if (parameterServers.stream().anyMatch(id -> sameHost(id, host))) {
            return "parameter server";
        }
        if (workers.stream().anyMatch(id -> sameHost(id, host))) {
            return "worker";
        }
        return null;
    }

    /** Compares as ONOS does (the document may spell a MAC in other case than ONOS prints it). */
    private static boolean sameHost(String id, HostId host) {
        try {
            return HostId.hostId(id).equals(host);
        } catch (RuntimeException e) {
            return false;
        }
    }
}
