package org.innetagg.onos.aggregation;

import org.onosproject.store.service.ConsistentMap;
import org.onosproject.store.service.Versioned;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;

/**
 * The slot ledger of the cluster: per switch, which job holds which slots, one entry of a
 * consistent map per switch. A job's claims on a switch are checked against the others' and
 * written by compare-and-set at the version read, so two nodes placing two jobs at once cannot
 * both take the same slots even without the placement lock: the second write finds the
 * version moved, reads again and sees the first job's claim. Two jobs never sum into the same
 * registers (docs/service.md, "Invariants").
 *
 * <p>An entry is {@code job:lo:hi} pairs joined by {@code ;} (job ids match
 * {@code [A-Za-z0-9][A-Za-z0-9_.-]*}): a String travels through any ONOS serializer.
 */
final class PoolClaims {
    /** One claim: slots [lo, hi) of a switch held by a job. */
    static final class Claim {
        final String job;
        final long lo;
        final long hi;

        Claim(String job, long lo, long hi) {
            this.job = job;
            this.lo = lo;
            this.hi = hi;
        }

        boolean overlaps(Claim o) {
            return lo < o.hi && o.lo < hi;
        }

        @Override
        public String toString() {
            return job + ":" + lo + ":" + hi;
        }
    }

    private final ConsistentMap<String, String> map;

    PoolClaims(ConsistentMap<String, String> map) {
        this.map = map;
    }

    static List<Claim> decode(String entry) {
        List<Claim> out = new ArrayList<>();
        if (entry == null || entry.isEmpty()) {
            return out;
        }
        for (String part : entry.split(";")) {
            String[] f = part.split(":");
            out.add(new Claim(f[0], Long.parseLong(f[1]), Long.parseLong(f[2])));
        }
        return out;
    }

    static String encode(List<Claim> claims) {
        StringBuilder sb = new StringBuilder();
        for (Claim c : claims) {
            if (sb.length() > 0) {
                sb.append(';');
            }
            sb.append(c);
        }
        return sb.toString();
    }

    /** The claims of a placement, by switch. */
    static Map<String, List<Claim>> of(JobPlacement placement) {
        Map<String, List<Claim>> out = new HashMap<>();
        for (AggregatorConfig a : placement.aggregators) {
            out.computeIfAbsent(a.switchId, k -> new ArrayList<>())
                    .add(new Claim(placement.jobId, a.poolBase, a.poolBase + a.poolSize));
        }
        return out;
    }

    /**
     * The job's claims become {@code wanted} (by switch; switches of {@code before} that it no
     * longer names lose the job's claims). With {@code check}, a wanted claim that overlaps
     * another job's refuses the whole change with 409 naming both jobs, and the switches
     * already changed are put back.
     */
    void set(JobPlacement placement, Map<String, List<Claim>> before, boolean check)
            throws InvalidPlacementException {
        Map<String, List<Claim>> wanted = of(placement);
        Set<String> switches = new TreeSet<>(wanted.keySet());
        switches.addAll(before.keySet());
        List<String> done = new ArrayList<>();
        for (String sw : switches) {
            try {
                swap(sw, placement.jobId, wanted.getOrDefault(sw, List.of()), check ? placement : null);
            } catch (InvalidPlacementException e) {
                restore(placement.jobId, before, done);
                throw e;
            }
            done.add(sw);
        }
    }

    /** The job's claims on {@code switches} become {@code before}'s again (unchecked). */
    void restore(String job, Map<String, List<Claim>> before, Iterable<String> switches) {
        for (String sw : switches) {
            try {
                swap(sw, job, before.getOrDefault(sw, List.of()), null);
            } catch (InvalidPlacementException e) {
                throw new IllegalStateException(e);  // unchecked swaps do not refuse
            }
        }
    }

    /** Every claim of the job on {@code switches} goes. */
    void release(String job, Set<String> switches) {
        restore(job, Map.of(), switches);
    }

    /** The job's claims on one switch, as the map holds them now. */
    List<Claim> held(String sw, String job) {
        List<Claim> out = new ArrayList<>();
        Versioned<String> v = map.get(sw);
        for (Claim c : decode(v == null ? null : v.value())) {
            if (c.job.equals(job)) {
                out.add(c);
            }
        }
        return out;
    }

    void clear() {
        map.clear();
    }

    /** Compare-and-set until it lands: the job's claims on {@code sw} become {@code mine}. */
    private void swap(String sw, String job, List<Claim> mine, JobPlacement checkFor)
            throws InvalidPlacementException {
        for (;;) {
            Versioned<String> v = map.get(sw);
            List<Claim> next = new ArrayList<>();
            for (Claim c : decode(v == null ? null : v.value())) {
                if (!c.job.equals(job)) {
                    next.add(c);
                }
            }
            if (checkFor != null) {
                for (Claim m : mine) {
                    for (Claim o : next) {
                        if (m.overlaps(o)) {
                            throw refusal(checkFor, sw, m, o);
                        }
                    }
                }
            }
            next.addAll(mine);
            next.sort((a, b) -> a.lo != b.lo ? Long.compare(a.lo, b.lo) : a.job.compareTo(b.job));
            String value = encode(next);
            boolean landed;
            if (v == null) {
                landed = next.isEmpty() || map.putIfAbsent(sw, value) == null;
            } else if (next.isEmpty()) {
                landed = map.remove(sw, v.version());
            } else {
                landed = value.equals(v.value()) || map.replace(sw, v.version(), value);
            }
            if (landed) {
                return;
            }
        }
    }

    static InvalidPlacementException refusal(JobPlacement placement, String sw, Claim mine, Claim other) {
        int index = 0;
        for (AggregatorConfig a : placement.aggregators) {
            if (a.switchId.equals(sw) && a.poolBase == mine.lo) {
                index = a.index;
                break;
            }
        }
        return new InvalidPlacementException(409, "jobs[0].aggregators[" + index + "].pool",
                "slots [" + mine.lo + ", " + mine.hi + ") of job '" + placement.jobId + "' overlap job '"
                        + other.job + "' slots [" + other.lo + ", " + other.hi + ") on '" + sw + "'");
    }
}
