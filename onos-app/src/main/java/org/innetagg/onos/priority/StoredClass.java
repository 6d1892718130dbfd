package org.innetagg.onos.priority;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.google.common.collect.ImmutableList;
import org.innetagg.onos.aggregation.InvalidPlacementException;
import org.onosproject.core.ApplicationId;
import org.onosproject.net.DeviceId;
import org.onosproject.net.flow.FlowRule;

import java.io.IOException;
import java.util.List;
import java.util.Objects;
import java.util.stream.Collectors;

/**
 * A job's traffic class as the distributed store keeps it: the document as posted, the job's
 * number and the switches resolved when it was posted (the default, every available switch
 * of ours, is resolved then and not later). Its traffic_class entries follow from it alone.
 * Immutable; Kryo-serializable (strings, an int, Guava's immutable list).
 */
public final class StoredClass {
    private static final ObjectMapper JSON = new ObjectMapper();

    final String jobId;
    final String document;
    final int p4JobId;
    final ImmutableList<String> switches;

    StoredClass(JobClass jobClass, int p4JobId, List<DeviceId> switches) {
        this.jobId = jobClass.jobId;
        this.document = jobClass.document.toString();
        this.p4JobId = p4JobId;
        this.switches = switches.stream().map(DeviceId::toString).collect(ImmutableList.toImmutableList());
    }

    /** The document decoded again (it was checked when posted; decoding is pure). */
    JobClass jobClass() {
        try {
            return JobClass.decode(jobId, JSON.readTree(document));
        } catch (InvalidPlacementException | IOException e) {
            throw new IllegalStateException("stored class of '" + jobId + "' no longer decodes", e);
        }
    }

    List<DeviceId> devices() {
        return switches.stream().map(DeviceId::deviceId).collect(Collectors.toList());
    }

    /** One traffic_class entry per switch, in the order of {@link #switches}. */
    List<FlowRule> rules(ApplicationId appId) {
        int cls = jobClass().priorityClass;
        return devices().stream()
                .map(d -> TrafficClassTranslator.classRule(appId, d, p4JobId, cls))
                .collect(Collectors.toList());
    }

    AppliedClass applied(ApplicationId appId, boolean created) {
        return new AppliedClass(jobClass(), p4JobId, devices(), rules(appId), created);
    }

    @Override
    public boolean equals(Object o) {
        if (!(o instanceof StoredClass)) {
            return false;
        }
        StoredClass s = (StoredClass) o;
        return p4JobId == s.p4JobId && jobId.equals(s.jobId) && document.equals(s.document)
                && switches.equals(s.switches);
    }

    @Override
    public int hashCode() {
        return Objects.hash(jobId, document, p4JobId, switches);
    }
}
