package org.innetagg.onos.aggregation;

import java.util.Optional;

/**
 * The number a job is known by at the switches (the aggregation header's 16-bit
 * {@code job_id}), shared by every resource that writes entries for the job
 * (docs/onos-aggregation-api.md: the aggregation resource and the traffic-class resource).
 * A job keeps its number while any holder holds it; a job without one gets the lowest free
 * number; the number is freed when its last holder lets it go.
 */
public interface JobNumberService {

    /** What holds a job's number: one per resource that writes entries keyed on it. */
    enum Holder {
        /** The job's aggregation placement (agg_job entries). */
        AGGREGATION,
        /** The job's traffic class (traffic_class entries). */
        TRAFFIC_CLASS
    }

    /**
     * The job's number, taking the lowest free one when the job has none; {@code holder}
     * holds it from now on (again: idempotent).
     *
     * @throws InvalidPlacementException 503 (field {@code job}) when every number is in use
     */
    int acquire(String jobId, Holder holder) throws InvalidPlacementException;

    /** The job's number, if any holder holds one. */
    Optional<Integer> number(String jobId);

    /** {@code holder} no longer needs the job's number; it is freed when no holder is left. */
    void release(String jobId, Holder holder);

    /** {@code holder} lets go of every job's number (its component stops). */
    void releaseAll(Holder holder);
}
