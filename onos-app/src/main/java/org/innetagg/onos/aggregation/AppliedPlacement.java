package org.innetagg.onos.aggregation;

import com.fasterxml.jackson.databind.node.ObjectNode;
import org.onosproject.net.flow.FlowRule;

import java.util.List;

/** A job's placement in force: its number at the switches and the rules written for it. */
public final class AppliedPlacement {
    public final JobPlacement placement;
    public final int p4JobId;
    public final List<FlowRule> rules;
    /** True when this POST created the job (201), false when it replaced it (200). */
    public final boolean created;

    public AppliedPlacement(JobPlacement placement, int p4JobId, List<FlowRule> rules, boolean created) {
        this.placement = placement;
        this.p4JobId = p4JobId;
        this.rules = List.copyOf(rules);
        this.created = created;
    }

    /** The placement document as posted, plus {@code p4_job_id} (docs/onos-aggregation-api.md). */
    public ObjectNode document() {
        ObjectNode doc = placement.document.deepCopy();
        doc.put("p4_job_id", p4JobId);
        return doc;
    }
}
