package org.innetagg.onos.aggregation;

import org.onosproject.store.serializers.KryoNamespaces;
import org.onosproject.store.service.ConsistentMap;
import org.onosproject.store.service.Serializer;
import org.onosproject.store.service.StorageService;
import org.onosproject.store.service.Versioned;
import org.osgi.service.component.annotations.Activate;
import org.osgi.service.component.annotations.Component;
import org.osgi.service.component.annotations.Reference;
import org.osgi.service.component.annotations.ReferenceCardinality;

import java.util.List;
import java.util.Optional;
import java.util.function.Function;

import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_AGGREGATION_AGG_JOB_SIZE;

/**
 * Job numbers in ONOS's distributed store, the same on every node of a cluster and kept
 * across a node's restart.
 *
 * <p>Why one compare-and-set value ({@link JobNumberTable} under one key of a consistent
 * map) rather than a map number -> job with {@code putIfAbsent}: taking a number for a new job
 * must keep two invariants at once, a number is one job's and a job has one number. A
 * number -> job map makes the first atomic, but two nodes taking a number for the same new
 * job at once would each take one, and undoing the loser's is a second write a crash can
 * skip (a number lost until someone notices). Replacing the whole table only if its version is
 * still the one read makes every change one atomic write; a node that loses the race reads
 * the winner's table and tries again. 256 jobs at most, written only when a job gains or loses
 * a holder: the value stays small and contention low.
 */
@Component(immediate = true, service = JobNumberService.class)
public class JobNumberRegistry implements JobNumberService {
    /** Job numbers the data plane can hold at once: one agg_job entry per job and switch. */
    public static final int JOB_NUMBERS = INGRESS_PIPE_AGGREGATION_AGG_JOB_SIZE;

    static final String MAP = "innet-agg-job-numbers";
    private static final String KEY = "table";
    /** The values of this registry's map, on top of ONOS's API namespace. */
    public static final Serializer SERIALIZER = Serializer.using(KryoNamespaces.API,
            JobNumberTable.class, JobNumberTable.Held.class);

    @Reference(cardinality = ReferenceCardinality.MANDATORY)
    protected StorageService storageService;

    private ConsistentMap<String, JobNumberTable> table;

    @Activate
    protected void activate() {
        table = storageService.<String, JobNumberTable>consistentMapBuilder()
                .withName(MAP)
                .withSerializer(SERIALIZER)
                .build();
    }

    @Override
    public int acquire(String jobId, Holder holder) throws InvalidPlacementException {
        for (;;) {
            Versioned<JobNumberTable> read = table.get(KEY);
            JobNumberTable now = read == null ? JobNumberTable.EMPTY : read.value();
            if (now.holds(jobId, holder)) {
                return now.number(jobId).orElseThrow();
            }
            int number = now.number(jobId).isPresent() ? now.number(jobId).get()
                    : now.lowestFree(JOB_NUMBERS).orElseThrow(() -> new InvalidPlacementException(
                            503, "job", "all " + JOB_NUMBERS + " job numbers are in use"));
            if (swap(read, now.withHolder(jobId, holder, number))) {
                return number;
            }
        }
    }

    @Override
    public Optional<Integer> number(String jobId) {
        Versioned<JobNumberTable> read = table.get(KEY);
        return read == null ? Optional.empty() : read.value().number(jobId);
    }

    @Override
    public void release(String jobId, Holder holder) {
        update(t -> t.without(List.of(jobId), holder));
    }

    @Override
    public void releaseAll(Holder holder) {
        update(t -> t.without(t.jobIds(), holder));
    }

    private void update(Function<JobNumberTable, JobNumberTable> change) {
        for (;;) {
            Versioned<JobNumberTable> read = table.get(KEY);
            if (read == null) {
                return;
            }
            JobNumberTable next = change.apply(read.value());
            if (next.equals(read.value()) || swap(read, next)) {
                return;
            }
        }
    }

    /** Writes {@code next} if the table is still at the version {@code read} (null: absent). */
    private boolean swap(Versioned<JobNumberTable> read, JobNumberTable next) {
        return read == null ? table.putIfAbsent(KEY, next) == null : table.replace(KEY, read.version(), next);
    }
}
