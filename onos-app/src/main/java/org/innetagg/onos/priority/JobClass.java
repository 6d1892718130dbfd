package org.innetagg.onos.priority;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.innetagg.onos.aggregation.InvalidPlacementException;
import org.innetagg.onos.aggregation.JobPlacement;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;

import static org.innetagg.onos.pipeconf.P4InfoConstants.CLASS_BITWIDTH;

/**
 * The traffic-class document of a job (docs/onos-aggregation-api.md, "Traffic-class
 * resource"): {@code {"job_id", "priority_class", "switches"?}}. Decoding checks everything
 * that needs no devices; {@link TrafficClassManager} checks the switches.
 */
public final class JobClass {
    /** Classes the data plane has: set_class's {@code class} parameter (3 bits, 0..7). */
    public static final int MAX_CLASS = (1 << CLASS_BITWIDTH) - 1;

    public final String jobId;
    public final int priorityClass;
    /** The switches listed, as posted; empty when the document lists none (every switch of ours). */
    public final Optional<List<String>> switches;
    /** The document as posted. */
    public final ObjectNode document;

    private JobClass(String jobId, int priorityClass, Optional<List<String>> switches, ObjectNode document) {
        this.jobId = jobId;
        this.priorityClass = priorityClass;
        this.switches = switches.map(List::copyOf);
        this.document = document;
    }

    /** Decodes and checks the document POSTed to {@code /priority/{pathJob}}. */
    public static JobClass decode(String pathJob, JsonNode doc) throws InvalidPlacementException {
        if (pathJob == null || !JobPlacement.JOB_ID.matcher(pathJob).matches()) {
            throw new InvalidPlacementException("job",
                    "'" + pathJob + "' does not match " + JobPlacement.JOB_ID.pattern());
        }
        if (doc == null || !doc.isObject()) {
            throw new InvalidPlacementException("body", "a traffic-class document (JSON object) expected");
        }
        JsonNode id = doc.get("job_id");
        if (id == null || !id.isTextual() || id.asText().isEmpty()) {
            throw new InvalidPlacementException("job_id", "a non-empty string expected");
        }
        if (!id.asText().equals(pathJob)) {
            throw new InvalidPlacementException("job_id",
                    "'" + id.asText() + "' is not the job of the path, '" + pathJob + "'");
        }
        JsonNode cls = doc.get("priority_class");
        if (cls == null || !cls.isIntegralNumber() || !cls.canConvertToInt()
                || cls.asInt() < 0 || cls.asInt() > MAX_CLASS) {
            throw new InvalidPlacementException("priority_class",
                    "an integer 0.." + MAX_CLASS + " expected, got " + cls);
        }
        return new JobClass(pathJob, cls.asInt(), switches(doc.get("switches")), ((ObjectNode) doc).deepCopy());
    }

    private static Optional<List<String>> switches(JsonNode node) throws InvalidPlacementException {
        if (node == null || node.isNull()) {
            return Optional.empty();
        }
        if (!node.isArray()) {
            throw new InvalidPlacementException("switches", "a list of device ids expected");
        }
        List<String> out = new ArrayList<>();
        Map<String, Integer> seen = new HashMap<>();
        for (int i = 0; i < node.size(); i++) {
            JsonNode s = node.get(i);
            if (!s.isTextual() || s.asText().isEmpty()) {
                throw new InvalidPlacementException("switches[" + i + "]", "a device id (string) expected");
            }
            Integer before = seen.putIfAbsent(s.asText(), i);
            if (before != null) {
                throw new InvalidPlacementException("switches[" + i + "]",
                        "'" + s.asText() + "' is listed twice (switches[" + before + "])");
            }
            out.add(s.asText());
        }
        return Optional.of(out);
    }
}
