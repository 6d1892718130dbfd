package org.innetagg.onos.ui;

import org.junit.Before;
import org.junit.Test;
import org.onosproject.ui.topo.PropertyPanel;

import java.util.Map;
import java.util.stream.Collectors;

import static org.innetagg.onos.ui.UiTestTopology.H1;
import static org.innetagg.onos.ui.UiTestTopology.H2;
import static org.innetagg.onos.ui.UiTestTopology.H4;
import static org.innetagg.onos.ui.UiTestTopology.H5;
import static org.innetagg.onos.ui.UiTestTopology.LEAF1;
import static org.innetagg.onos.ui.UiTestTopology.LEAF2;
import static org.innetagg.onos.ui.UiTestTopology.SPINE1;
import static org.innetagg.onos.ui.UiTestTopology.fixture;
import static org.junit.Assert.assertEquals;

/** The summary and details panels while the overlay is active. */
public class AggregationTopoOverlayTest {
    private AggregationTopoOverlay overlay;

    @Before
    public void setUp() throws Exception {
        UiTestTopology.Placements placements = new UiTestTopology.Placements();
        placements.put(fixture("resnet-a", "valid.json"));
        placements.put(fixture("bert-b", "ui/unpinned.json"));
        overlay = new AggregationTopoOverlay(placements);
    }

    @Test
    public void summaryCountsThePlacedJobs() {
        PropertyPanel pp = new PropertyPanel("ONOS Summary", "bird");
        overlay.modifySummary(pp);
        assertEquals(Map.of("Aggregation jobs", "2"), props(pp));
    }

    @Test
    public void aDeviceNamesTheJobsItAggregates() {
        PropertyPanel leaf2 = new PropertyPanel("leaf2", "switch");
        overlay.modifyDeviceDetails(leaf2, LEAF2);
        assertEquals(Map.of("Aggregates resnet-a", "fan-in 2, slots [128, 192) → 00:00:00:00:00:04/None",
                            "Aggregates bert-b", "fan-in 2, slots [256, 320) → 00:00:00:00:00:03/None"),
                     props(leaf2));
        PropertyPanel leaf1 = new PropertyPanel("leaf1", "switch");
        overlay.modifyDeviceDetails(leaf1, LEAF1);
        assertEquals(Map.of("Aggregates resnet-a", "fan-in 2, slots [0, 128) → device:leaf2"), props(leaf1));
        PropertyPanel spine = new PropertyPanel("spine1", "switch");
        overlay.modifyDeviceDetails(spine, SPINE1);
        assertEquals(Map.of(), props(spine));
    }

    @Test
    public void aHostNamesItsRoleInEachJob() {
        assertEquals(Map.of("Job resnet-a", "worker", "Job bert-b", "worker"), hostProps(H1));
        assertEquals(Map.of("Job resnet-a", "worker"), hostProps(H2));
        assertEquals(Map.of("Job resnet-a", "parameter server"), hostProps(H4));
        // the document spells fe:..., ONOS FE:...
        assertEquals(Map.of("Job bert-b", "worker"), hostProps(H5));
    }

    private Map<String, String> hostProps(org.onosproject.net.HostId host) {
        PropertyPanel pp = new PropertyPanel(host.toString(), "endstation");
        overlay.modifyHostDetails(pp, host);
        return props(pp);
    }

    private static Map<String, String> props(PropertyPanel pp) {
        return pp.properties().stream().collect(Collectors.toMap(PropertyPanel.Prop::label,
                                                                 PropertyPanel.Prop::value));
    }
}
