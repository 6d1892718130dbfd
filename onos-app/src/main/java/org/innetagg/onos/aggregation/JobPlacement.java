package org.innetagg.onos.aggregation;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import java.util.ArrayList;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.regex.Pattern;

import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_AGGREGATION_AGG_BITMAP_BITWIDTH;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_AGGREGATION_AGG_COUNT_SIZE;

/**
 * The part of a placement document (docs/documents.md) the app applies: one job, its
 * aggregators and its workers' pinned paths. Decoding checks everything that needs no
 * topology; {@link AggregationManager} checks devices and links.
 */
public final class JobPlacement {
    /** docs/onos-aggregation-api.md: the {job} path parameter. */
    public static final Pattern JOB_ID = Pattern.compile("[A-Za-z0-9][A-Za-z0-9_.-]{0,63}");
    /** Slots per switch: the size of the per-slot registers. */
    public static final int SLOTS = INGRESS_PIPE_AGGREGATION_AGG_COUNT_SIZE;
    /** Child streams are told apart by one bit each of the contributors bitmap. */
    public static final int MAX_FAN_IN = INGRESS_PIPE_AGGREGATION_AGG_BITMAP_BITWIDTH;

    public final String jobId;
    public final List<AggregatorConfig> aggregators;
    public final Map<String, List<String>> workerPaths;
    /** The document as posted, returned by GET. */
    public final ObjectNode document;

    private JobPlacement(String jobId, List<AggregatorConfig> aggregators, Map<String, List<String>> workerPaths,
                         ObjectNode document) {
        this.jobId = jobId;
        this.aggregators = List.copyOf(aggregators);
        this.workerPaths = Map.copyOf(workerPaths);
        this.document = document;
    }

    /** Decodes and checks the document POSTed to {@code /aggregation/{pathJob}}. */
    public static JobPlacement decode(String pathJob, JsonNode doc) throws InvalidPlacementException {
        if (pathJob == null || !JOB_ID.matcher(pathJob).matches()) {
            throw new InvalidPlacementException("job", "'" + pathJob + "' does not match " + JOB_ID.pattern());
        }
        if (doc == null || !doc.isObject()) {
            throw new InvalidPlacementException("body", "a placement document (JSON object) expected");
        }
        JsonNode jobs = doc.get("jobs");
        if (jobs == null || !jobs.isArray() || jobs.size() != 1) {
            throw new InvalidPlacementException("jobs", "exactly one job expected");
        }
        JsonNode job = jobs.get(0);
        String jobId = text(job, "job_id", "jobs[0].job_id");
        if (!jobId.equals(pathJob)) {
            throw new InvalidPlacementException("jobs[0].job_id",
                    "'" + jobId + "' is not the job of the path, '" + pathJob + "'");
        }
        JsonNode aggs = job.get("aggregators");
        if (aggs == null || !aggs.isArray()) {
            throw new InvalidPlacementException("jobs[0].aggregators", "a list expected");
        }
        List<AggregatorConfig> list = new ArrayList<>();
        Map<String, Integer> seen = new LinkedHashMap<>();
        for (int i = 0; i < aggs.size(); i++) {
            AggregatorConfig a = aggregator(i, aggs.get(i));
            Integer before = seen.putIfAbsent(a.switchId, i);
            if (before != null) {
                throw new InvalidPlacementException(a.field("switch"),
                        "'" + a.switchId + "' already aggregates this job (aggregators[" + before + "])");
            }
            list.add(a);
        }
        Map<String, List<String>> paths = new LinkedHashMap<>();
        JsonNode wp = job.get("worker_paths");
        if (wp != null && !wp.isNull()) {
            if (!wp.isObject()) {
                throw new InvalidPlacementException("jobs[0].worker_paths", "an object expected");
            }
            Iterator<Map.Entry<String, JsonNode>> it = wp.fields();
            while (it.hasNext()) {
                Map.Entry<String, JsonNode> e = it.next();
                paths.put(e.getKey(), strings(e.getValue(), "jobs[0].worker_paths." + e.getKey()));
            }
        }
        return new JobPlacement(jobId, list, paths, ((ObjectNode) doc).deepCopy());
    }

    private static AggregatorConfig aggregator(int i, JsonNode a) throws InvalidPlacementException {
        String f = "jobs[0].aggregators[" + i + "]";
        if (a == null || !a.isObject()) {
            throw new InvalidPlacementException(f, "an object expected");
        }
        String sw = text(a, "switch", f + ".switch");
        String nextHop = text(a, "next_hop", f + ".next_hop");
        List<String> children = a.has("children") ? strings(a.get("children"), f + ".children") : List.of();
        long fanIn = integer(a, "fan_in", f + ".fan_in");
        if (fanIn < 1 || fanIn > MAX_FAN_IN) {
            throw new InvalidPlacementException(f + ".fan_in", "must be 1.." + MAX_FAN_IN + ", got " + fanIn);
        }
        JsonNode pool = a.get("pool");
        if (pool == null || !pool.isObject()) {
            throw new InvalidPlacementException(f + ".pool", "an object {base, size} expected");
        }
        long base = integer(pool, "base", f + ".pool.base");
        long size = integer(pool, "size", f + ".pool.size");
        if (base < 0 || size < 1 || base + size > SLOTS) {
            throw new InvalidPlacementException(f + ".pool", "slots [" + base + ", " + (base + size)
                    + ") are not within the switch's " + SLOTS + " slots");
        }
        return new AggregatorConfig(i, sw, children, (int) fanIn, nextHop, base, (int) size);
    }

    private static String text(JsonNode node, String key, String field) throws InvalidPlacementException {
        JsonNode v = node.get(key);
        if (v == null || !v.isTextual() || v.asText().isEmpty()) {
            throw new InvalidPlacementException(field, "a non-empty string expected");
        }
        return v.asText();
    }

    private static long integer(JsonNode node, String key, String field) throws InvalidPlacementException {
        JsonNode v = node.get(key);
        if (v == null || !v.canConvertToLong() || !v.isIntegralNumber()) {
            throw new InvalidPlacementException(field, "an integer expected");
        }
        return v.asLong();
    }

    private static List<String> strings(JsonNode node, String field) throws InvalidPlacementException {
        if (!(node instanceof ArrayNode)) {
            throw new InvalidPlacementException(field, "a list of node ids expected");
        }
        List<String> out = new ArrayList<>();
        for (JsonNode n : node) {
            if (!n.isTextual()) {
                throw new InvalidPlacementException(field, "a list of node ids expected");
            }
            out.add(n.asText());
        }
        return out;
    }
}
