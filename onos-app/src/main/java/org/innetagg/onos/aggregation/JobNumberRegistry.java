package org.innetagg.onos.aggregation;

import org.osgi.service.component.annotations.Component;
import org.osgi.service.component.annotations.Deactivate;

import java.util.EnumSet;
import java.util.HashMap;
import java.util.Map;
import java.util.Optional;
import java.util.Set;

import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_AGGREGATION_AGG_JOB_SIZE;

/**
 * Job numbers in memory on this instance, like the placements and classes that hold them
 * (single-instance ONOS; a cluster would need a distributed store).
 */
@Component(immediate = true, service = JobNumberService.class)
public class JobNumberRegistry implements JobNumberService {
    /** Job numbers the data plane can hold at once: one agg_job entry per job and switch. */
    public static final int JOB_NUMBERS = INGRESS_PIPE_AGGREGATION_AGG_JOB_SIZE;

    /** A job's number and who holds it (never empty: a job nobody holds is removed). */
    private static final class Held {
        final int number;
        final Set<Holder> holders = EnumSet.noneOf(Holder.class);

        Held(int number) {
            this.number = number;
        }
    }

    private final Map<String, Held> jobs = new HashMap<>();

    @Deactivate
    protected synchronized void deactivate() {
        jobs.clear();
    }

    @Override
    public synchronized int acquire(String jobId, Holder holder) throws InvalidPlacementException {
        Held held = jobs.get(jobId);
        if (held == null) {
            held = new Held(lowestFree());
            jobs.put(jobId, held);
        }
        held.holders.add(holder);
        return held.number;
    }

    @Override
    public synchronized Optional<Integer> number(String jobId) {
        Held held = jobs.get(jobId);
        return held == null ? Optional.empty() : Optional.of(held.number);
    }

    @Override
    public synchronized void release(String jobId, Holder holder) {
        Held held = jobs.get(jobId);
        if (held != null) {
            held.holders.remove(holder);
            if (held.holders.isEmpty()) {
                jobs.remove(jobId);
            }
        }
    }

    @Override
    public synchronized void releaseAll(Holder holder) {
        jobs.values().forEach(h -> h.holders.remove(holder));
        jobs.values().removeIf(h -> h.holders.isEmpty());
    }

    private int lowestFree() throws InvalidPlacementException {
        boolean[] used = new boolean[JOB_NUMBERS];
        jobs.values().forEach(h -> used[h.number] = true);
        for (int n = 0; n < JOB_NUMBERS; n++) {
            if (!used[n]) {
                return n;
            }
        }
        throw new InvalidPlacementException(503, "job", "all " + JOB_NUMBERS + " job numbers are in use");
    }
}
