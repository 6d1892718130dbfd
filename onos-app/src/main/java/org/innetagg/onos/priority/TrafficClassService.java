package org.innetagg.onos.priority;

import org.innetagg.onos.aggregation.InvalidPlacementException;

import java.util.List;
import java.util.Optional;

/**
 * Applies jobs' strict-priority classes as traffic_class table entries
 * (docs/onos-aggregation-api.md, "Traffic-class resource").
 */
public interface TrafficClassService {

    /**
     * Writes the job's entry on every switch of the document (by default every available
     * device running our pipeconf) and removes its entries on switches no longer listed.
     */
    AppliedClass apply(JobClass jobClass) throws InvalidPlacementException;

    Optional<AppliedClass> get(String jobId);

    /** The classes in force, sorted by job id (read-only). */
    List<AppliedClass> classes();

    /**
     * Deletes the job's entries and lets go of its number (freed unless the job's aggregation
     * placement still holds it); false when the job had no class.
     */
    boolean remove(String jobId);
}
