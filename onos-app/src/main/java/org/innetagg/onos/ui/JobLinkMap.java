package org.innetagg.onos.ui;

import org.onosproject.net.Link;
import org.onosproject.net.LinkKey;
import org.onosproject.ui.topo.BiLink;
import org.onosproject.ui.topo.BiLinkMap;
import org.onosproject.ui.topo.LinkHighlight;

/**
 * The links of a job's paths, both directions of a link as one, as the topology view draws
 * them. A host's link gets the id the view gives it ("host/0-device/port", topoModel.js):
 * the canonical key puts the smaller element id first, and ONOS prints MACs in upper case
 * while DeviceId lower-cases the whole id, so the host always comes first.
 */
final class JobLinkMap extends BiLinkMap<JobLinkMap.JobLink> {

    @Override
    protected JobLink create(LinkKey key, Link link) {
        return new JobLink(key, link);
    }

    /** One drawn link of the job, always primary-highlighted. */
    static final class JobLink extends BiLink {

        JobLink(LinkKey key, Link link) {
            super(key, link);
        }

        @Override
        public LinkHighlight highlight(Enum<?> type) {
            return new LinkHighlight(linkId(), LinkHighlight.Flavor.PRIMARY_HIGHLIGHT);
        }
    }
}
