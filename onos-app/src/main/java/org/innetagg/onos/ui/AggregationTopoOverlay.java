package org.innetagg.onos.ui;

import org.innetagg.onos.aggregation.AggregationService;
import org.innetagg.onos.aggregation.AggregatorConfig;
import org.innetagg.onos.aggregation.AppliedPlacement;
import org.onosproject.net.DeviceId;
import org.onosproject.net.HostId;
import org.onosproject.ui.UiTopoOverlay;
import org.onosproject.ui.topo.PropertyPanel;

import static com.google.common.base.Preconditions.checkNotNull;

/**
 * The innet-agg overlay of the topology view. While it is the active overlay, the summary
 * counts the placed jobs and a device's or host's details name its part in each job.
 */
public class AggregationTopoOverlay extends UiTopoOverlay {
    /** Must match overlayId in app/view/innetAggTopov/innetAggTopovOverlay.js (checked by a test). */
    public static final String OVERLAY_ID = "innet-agg-overlay";

    private final AggregationService aggregation;

    public AggregationTopoOverlay(AggregationService aggregation) {
        super(OVERLAY_ID);
        this.aggregation = checkNotNull(aggregation);
    }

    @Override
    public void modifySummary(PropertyPanel pp) {
        pp.addProp("innetAggJobs", "Aggregation jobs", aggregation.placements().size());
    }

    @Override
    public void modifyDeviceDetails(PropertyPanel pp, DeviceId deviceId) {
        for (AppliedPlacement applied : aggregation.placements()) {
            for (AggregatorConfig a : applied.placement.aggregators) {
                if (sameDevice(a.switchId, deviceId)) {
                    pp.addProp("innetAgg-" + applied.placement.jobId, "Aggregates " + applied.placement.jobId,
                               JobView.aggregatorText(a));
                }
            }
        }
    }

    @Override
    public void modifyHostDetails(PropertyPanel pp, HostId hostId) {
        for (AppliedPlacement applied : aggregation.placements()) {
            String role = JobRoles.of(applied.placement).roleOf(hostId);
            if (role != null) {
                pp.addProp("innetAgg-" + applied.placement.jobId, "Job " + applied.placement.jobId, role);
            }
        }
    }

    private static boolean sameDevice(String id, DeviceId device) {
        try {
            return DeviceId.deviceId(id).equals(device);
        } catch (IllegalArgumentException e) {
            return false;
        }
    }
}
