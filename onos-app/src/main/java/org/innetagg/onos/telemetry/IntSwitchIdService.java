package org.innetagg.onos.telemetry;

import org.onosproject.net.DeviceId;

import java.util.Map;

/**
 * The INT node ID of each device: the number a switch writes into every INT hop and report,
 * and by which the collector and the optimizer name it (docs/telemetry-schema.md).
 */
public interface IntSwitchIdService {

    /** Device annotation holding the node ID (decimal); the optimizer maps INT rows by it. */
    String ANNOTATION = "intSwitchId";

    /**
     * The device's node ID: its {@value #ANNOTATION} annotation when that is a valid number no
     * other device claims, else the lowest free number, which is then published as the
     * device's annotation (network configuration) so that every reader sees the same mapping.
     */
    int switchId(DeviceId deviceId);

    /** The node IDs given out or found so far. */
    Map<DeviceId, Integer> switchIds();
}
