package org.innetagg.onos.priority;

import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.onosproject.net.DeviceId;
import org.onosproject.net.flow.FlowRule;

import java.util.List;

/** A job's traffic class in force: its number at the switches and the entries written. */
public final class AppliedClass {
    public final JobClass jobClass;
    public final int p4JobId;
    /** The switches written, in the order listed (or, by default, by device id). */
    public final List<DeviceId> switches;
    /** One traffic_class entry per switch, in the order of {@link #switches}. */
    public final List<FlowRule> rules;
    /** True when this POST created the job's class (201), false when it replaced it (200). */
    public final boolean created;

    public AppliedClass(JobClass jobClass, int p4JobId, List<DeviceId> switches, List<FlowRule> rules,
                        boolean created) {
        this.jobClass = jobClass;
        this.p4JobId = p4JobId;
        this.switches = List.copyOf(switches);
        this.rules = List.copyOf(rules);
        this.created = created;
    }

    /** The document as posted, with the switches written and {@code p4_job_id}. */
    public ObjectNode document() {
        ObjectNode doc = jobClass.document.deepCopy();
        ArrayNode written = doc.putArray("switches");
        switches.forEach(d -> written.add(d.toString()));
        doc.put("p4_job_id", p4JobId);
        return doc;
    }
}
