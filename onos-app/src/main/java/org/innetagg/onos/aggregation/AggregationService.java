package org.innetagg.onos.aggregation;

import java.util.List;
import java.util.Optional;

/** Applies aggregation placements as agg_job table entries (docs/onos-aggregation-api.md). */
public interface AggregationService {

    /** Writes the job's entries, replacing its previous ones; idempotent. */
    AppliedPlacement apply(JobPlacement placement) throws InvalidPlacementException;

    Optional<AppliedPlacement> get(String jobId);

    /** The placements in force, sorted by job id (read-only; for views such as the GUI overlay). */
    List<AppliedPlacement> placements();

    /**
     * Deletes the job's entries and lets go of its number (freed unless the job's traffic
     * class still holds it); false when there was no such job.
     */
    boolean remove(String jobId);
}
