package org.innetagg.onos.aggregation;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.google.common.collect.ImmutableList;
import org.onosproject.core.ApplicationId;
import org.onosproject.net.DeviceId;
import org.onosproject.net.PortNumber;
import org.onosproject.net.flow.FlowRule;

import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import java.util.Objects;

/**
 * A job's placement as the distributed store keeps it: the document as posted, the job's
 * number and each aggregator's next-hop port as resolved when it was posted. Its agg_job
 * entries follow from it alone ({@link #rules}), so any node re-derives exactly the entries
 * the posting node wrote, whatever the topology has become since. Immutable; Kryo-serializable
 * (strings, an int and Guava's immutable list, all in ONOS's API namespace).
 */
public final class StoredPlacement {
    private static final ObjectMapper JSON = new ObjectMapper();

    final String jobId;
    final String document;
    final int p4JobId;
    final ImmutableList<Long> nextHopPorts;

    StoredPlacement(JobPlacement placement, int p4JobId, List<PortNumber> nextHopPorts) {
        this.jobId = placement.jobId;
        this.document = placement.document.toString();
        this.p4JobId = p4JobId;
        this.nextHopPorts = nextHopPorts.stream().map(PortNumber::toLong).collect(ImmutableList.toImmutableList());
    }

    /** The placement decoded again (it was checked when posted; decoding is pure). */
    JobPlacement placement() {
        try {
            return JobPlacement.decode(jobId, JSON.readTree(document));
        } catch (InvalidPlacementException | IOException e) {
            throw new IllegalStateException("stored placement of '" + jobId + "' no longer decodes", e);
        }
    }

    /** One agg_job entry per aggregator, in the document's order. */
    List<FlowRule> rules(ApplicationId appId) {
        List<AggregatorConfig> aggs = placement().aggregators;
        List<FlowRule> rules = new ArrayList<>();
        for (int i = 0; i < aggs.size(); i++) {
            rules.add(AggregationTranslator.aggJobRule(appId, DeviceId.deviceId(aggs.get(i).switchId), p4JobId,
                    aggs.get(i), PortNumber.portNumber(nextHopPorts.get(i))));
        }
        return rules;
    }

    AppliedPlacement applied(ApplicationId appId, boolean created) {
        return new AppliedPlacement(placement(), p4JobId, rules(appId), created);
    }

    @Override
    public boolean equals(Object o) {
        if (!(o instanceof StoredPlacement)) {
            return false;
        }
        StoredPlacement s = (StoredPlacement) o;
        return p4JobId == s.p4JobId && jobId.equals(s.jobId) && document.equals(s.document)
                && nextHopPorts.equals(s.nextHopPorts);
    }

    @Override
    public int hashCode() {
        return Objects.hash(jobId, document, p4JobId, nextHopPorts);
    }
}
