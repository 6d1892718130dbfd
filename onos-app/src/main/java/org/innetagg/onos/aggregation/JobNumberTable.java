package org.innetagg.onos.aggregation;

import com.google.common.collect.ImmutableMap;

import java.util.HashMap;
import java.util.Map;
import java.util.Objects;
import java.util.Optional;

import org.innetagg.onos.aggregation.JobNumberService.Holder;

/**
 * Every job's number and its holders, as one immutable value: {@link JobNumberRegistry}
 * replaces it whole with a compare-and-set, so both invariants (a number is one job's, a job
 * has one number) hold in every version any node reads. Kryo-serializable (Guava's immutable
 * map and plain fields; holders as a bit mask, Guava's enum sets are not registered in ONOS's
 * namespaces).
 */
public final class JobNumberTable {
    static final JobNumberTable EMPTY = new JobNumberTable(ImmutableMap.of());

    /** A job's number and, one bit per {@link Holder} ordinal, who holds it (never 0). */
    public static final class Held {
        final int number;
        final int holders;

        Held(int number, int holders) {
            this.number = number;
            this.holders = holders;
        }

        boolean heldBy(Holder holder) {
            return (holders & bit(holder)) != 0;
        }

        @Override
        public boolean equals(Object o) {
            return o instanceof Held && ((Held) o).number == number && ((Held) o).holders == holders;
        }

        @Override
        public int hashCode() {
            return Objects.hash(number, holders);
        }
    }

    private final ImmutableMap<String, Held> jobs;

    private JobNumberTable(ImmutableMap<String, Held> jobs) {
        this.jobs = jobs;
    }

    private static int bit(Holder holder) {
        return 1 << holder.ordinal();
    }

    Optional<Integer> number(String jobId) {
        Held held = jobs.get(jobId);
        return held == null ? Optional.empty() : Optional.of(held.number);
    }

    boolean holds(String jobId, Holder holder) {
        Held held = jobs.get(jobId);
        return held != null && held.heldBy(holder);
    }

    /** This table with {@code holder} holding the job's number, given {@code number} if it has none. */
    JobNumberTable withHolder(String jobId, Holder holder, int number) {
        Held held = jobs.get(jobId);
        Map<String, Held> next = new HashMap<>(jobs);
        next.put(jobId, held == null ? new Held(number, bit(holder))
                : new Held(held.number, held.holders | bit(holder)));
        return new JobNumberTable(ImmutableMap.copyOf(next));
    }

    /** This table without {@code holder} on any job of {@code jobIds}; a job nobody holds is dropped. */
    JobNumberTable without(Iterable<String> jobIds, Holder holder) {
        Map<String, Held> next = new HashMap<>(jobs);
        for (String jobId : jobIds) {
            Held held = next.get(jobId);
            if (held != null) {
                int left = held.holders & ~bit(holder);
                if (left == 0) {
                    next.remove(jobId);
                } else {
                    next.put(jobId, new Held(held.number, left));
                }
            }
        }
        return new JobNumberTable(ImmutableMap.copyOf(next));
    }

    Iterable<String> jobIds() {
        return jobs.keySet();
    }

    /** The lowest number no job holds, if any below {@code limit}. */
    Optional<Integer> lowestFree(int limit) {
        boolean[] used = new boolean[limit];
        jobs.values().forEach(h -> used[h.number] = true);
        for (int n = 0; n < limit; n++) {
            if (!used[n]) {
                return Optional.of(n);
            }
        }
        return Optional.empty();
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof JobNumberTable && ((JobNumberTable) o).jobs.equals(jobs);
    }

    @Override
    public int hashCode() {
        return jobs.hashCode();
    }
}
