package org.innetagg.onos.ui;

import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.innetagg.onos.aggregation.AggregationService;
import org.innetagg.onos.aggregation.AppliedPlacement;
import org.onlab.osgi.ServiceDirectory;
import org.onosproject.net.device.DeviceService;
import org.onosproject.net.host.HostService;
import org.onosproject.net.link.LinkService;
import org.onosproject.net.topology.PathService;
import org.onosproject.ui.JsonUtils;
import org.onosproject.ui.RequestHandler;
import org.onosproject.ui.UiConnection;
import org.onosproject.ui.UiMessageHandler;
import org.onosproject.ui.topo.Highlights;
import org.onosproject.ui.topo.TopoJson;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.util.Collection;
import java.util.List;
import java.util.Objects;
import java.util.Optional;
import java.util.function.Consumer;
import java.util.stream.Collectors;

/**
 * Answers the innet-agg topology overlay (app/view/innetAggTopov/innetAggTopov.js): the list
 * of placed jobs, and the highlights and panel of the selected one. One instance per GUI
 * connection; ONOS calls it on the connection's thread, so its state needs no locking.
 * The client asks for a refresh every few seconds while the overlay is active; only what
 * changed since the last answer is sent then.
 */
public class AggregationTopoMessageHandler extends UiMessageHandler {
    // Requests from the overlay.
    static final String START = "innetAggStart";
    static final String STOP = "innetAggStop";
    static final String SHOW = "innetAggShow";
    static final String SELECT = "innetAggSelect";
    static final String NEXT = "innetAggNext";
    static final String PREV = "innetAggPrev";
    static final String CLEAR = "innetAggClear";
    static final String REFRESH = "innetAggRefresh";
    // Answers (plus TopoJson's showHighlights).
    static final String JOB = "innetAggJob";
    static final String ERROR = "innetAggError";

    static final String JOB_ID = "job";
    static final String JOBS = "jobs";
    static final String PANEL = "panel";
    static final String MESSAGE = "message";

    private final Logger log = LoggerFactory.getLogger(getClass());

    private AggregationService aggregation;
    private JobView.Topology topology;

    /** The job shown, null when none. */
    private String selected;
    /** The last answers sent, to send only changes on a refresh. */
    private ObjectNode lastHighlights;
    private ObjectNode lastJob;

    @Override
    public void init(UiConnection connection, ServiceDirectory directory) {
        super.init(connection, directory);
        aggregation = directory.get(AggregationService.class);
        topology = new JobView.Topology(directory.get(DeviceService.class), directory.get(HostService.class),
                                        directory.get(LinkService.class), directory.get(PathService.class));
    }

    @Override
    protected Collection<RequestHandler> createRequestHandlers() {
        return List.of(
                new Handler(START, p -> {
                    keepSelectionElseFirst();
                    send(true, null);
                }),
                new Handler(STOP, p -> {
                    selected = null;
                    send(true, null);
                }),
                new Handler(SHOW, p -> {
                    keepSelectionElseFirst();
                    send(true, selected == null ? "no jobs are placed" : null);
                }),
                new Handler(SELECT, p -> {
                    String job = JsonUtils.string(p, JOB_ID);
                    if (job == null || job.isEmpty()) {
                        sendError("select: a job id expected");
                    } else if (aggregation.get(job).isEmpty()) {
                        sendError("no placement for job '" + job + "'");
                    } else {
                        selected = job;
                        send(true, null);
                    }
                }),
                new Handler(NEXT, p -> step(true)),
                new Handler(PREV, p -> step(false)),
                new Handler(CLEAR, p -> {
                    selected = null;
                    send(true, null);
                }),
                new Handler(REFRESH, p -> send(false, null))
        );
    }

    private void keepSelectionElseFirst() {
        if (selected == null || aggregation.get(selected).isEmpty()) {
            selected = jobIds().stream().findFirst().orElse(null);
        }
    }

    /** Selects the job after (or before) the selected one in job id order, wrapping around. */
    private void step(boolean forward) {
        List<String> ids = jobIds();
        if (ids.isEmpty()) {
            selected = null;
            send(true, null);
            sendError("no jobs are placed");
            return;
        }
        String at = selected;
        Optional<String> pick;
        if (forward) {
            pick = at == null ? Optional.empty() : ids.stream().filter(id -> id.compareTo(at) > 0).findFirst();
            selected = pick.orElse(ids.get(0));
        } else {
            pick = at == null ? Optional.empty()
                    : ids.stream().filter(id -> id.compareTo(at) < 0).reduce((x, y) -> y);
            selected = pick.orElse(ids.get(ids.size() - 1));
        }
        send(true, null);
    }

    private List<String> jobIds() {
        return aggregation.placements().stream().map(a -> a.placement.jobId).collect(Collectors.toList());
    }

    /**
     * Sends the selected job's highlights and the job message; on a refresh ({@code always}
     * false) only those that differ from what was sent last.
     */
    private void send(boolean always, String note) {
        List<AppliedPlacement> placements = aggregation.placements();
        String message = note;
        AppliedPlacement shown = null;
        if (selected != null) {
            String sel = selected;
            shown = placements.stream().filter(a -> a.placement.jobId.equals(sel)).findFirst().orElse(null);
            if (shown == null) {
                message = "job '" + selected + "' is no longer placed";
                selected = null;
            }
        }
        ObjectNode job = objectNode();
        ArrayNode ids = job.putArray(JOBS);
        placements.forEach(a -> ids.add(a.placement.jobId));
        Highlights highlights = new Highlights();
        if (shown != null) {
            JobView view = JobView.of(shown, topology);
            highlights = view.highlights;
            job.put(JOB_ID, shown.placement.jobId);
            job.set(PANEL, TopoJson.json(view.panel));
        } else {
            job.putNull(JOB_ID);
            job.putNull(PANEL);
        }
        if (message != null) {
            job.put(MESSAGE, message);
        }
        ObjectNode hl = TopoJson.highlightsMessage(highlights);
        if (always || !hl.equals(lastHighlights)) {
            lastHighlights = hl;
            sendMessage(hl);
        }
        // A note is said once: it does not make the next refresh differ.
        ObjectNode withoutNote = job.deepCopy();
        withoutNote.remove(MESSAGE);
        if (always || message != null || !withoutNote.equals(lastJob)) {
            lastJob = withoutNote;
            sendMessage(JsonUtils.envelope(JOB, job));
        }
    }

    private void sendError(String message) {
        ObjectNode payload = objectNode().put(MESSAGE, message);
        sendMessage(JsonUtils.envelope(ERROR, payload));
    }

    /** A request; what fails is answered as an error message, never thrown into ONOS's web socket. */
    private final class Handler extends RequestHandler {
        private final Consumer<ObjectNode> body;

        Handler(String eventType, Consumer<ObjectNode> body) {
            super(eventType);
            this.body = Objects.requireNonNull(body);
        }

        @Override
        public void process(ObjectNode payload) {
            try {
                body.accept(payload == null ? objectNode() : payload);
            } catch (RuntimeException e) {
                log.warn("innet-agg overlay: {} failed", eventType(), e);
                String why = e.getMessage() == null ? e.getClass().getSimpleName() : e.getMessage();
                sendError(eventType() + " failed: " + why);
            }
        }
    }
}
