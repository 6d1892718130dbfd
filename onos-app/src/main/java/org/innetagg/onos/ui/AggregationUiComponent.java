package org.innetagg.onos.ui;

import org.innetagg.onos.aggregation.AggregationService;
import org.onosproject.ui.UiExtension;
import org.onosproject.ui.UiExtensionService;
import org.onosproject.ui.UiMessageHandlerFactory;
import org.onosproject.ui.UiTopoOverlayFactory;
import org.onosproject.ui.UiViewHidden;
import org.osgi.service.component.annotations.Activate;
import org.osgi.service.component.annotations.Component;
import org.osgi.service.component.annotations.Deactivate;
import org.osgi.service.component.annotations.Reference;
import org.osgi.service.component.annotations.ReferenceCardinality;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.util.List;

/**
 * Adds the innet-agg overlay to ONOS's (legacy, AngularJS) topology view. The GUI loads the
 * overlay's scripts through {@code innetAggTopov/js.html} and {@code css.html}; the view is
 * hidden, it only carries the scripts (ONOS loads an extension's scripts per view).
 */
@Component(immediate = true)
public class AggregationUiComponent {
    /** View id, resource path and app/view/ directory; ONOS names the Angular module "ov" + capitalised id. */
    public static final String VIEW_ID = "innetAggTopov";

    private static final ClassLoader CL = AggregationUiComponent.class.getClassLoader();

    private final Logger log = LoggerFactory.getLogger(getClass());

    @Reference(cardinality = ReferenceCardinality.MANDATORY)
    protected UiExtensionService uiExtensionService;
    @Reference(cardinality = ReferenceCardinality.MANDATORY)
    protected AggregationService aggregationService;

    private UiExtension extension;

    @Activate
    protected void activate() {
        extension = extension(aggregationService);
        uiExtensionService.register(extension);
        log.info("Started");
    }

    @Deactivate
    protected void deactivate() {
        uiExtensionService.unregister(extension);
        extension = null;
        log.info("Stopped");
    }

    static UiExtension extension(AggregationService aggregation) {
        UiMessageHandlerFactory handlers = () -> List.of(new AggregationTopoMessageHandler());
        UiTopoOverlayFactory overlays = () -> List.of(new AggregationTopoOverlay(aggregation));
        return new UiExtension.Builder(CL, List.of(new UiViewHidden(VIEW_ID)))
                .resourcePath(VIEW_ID)
                .messageHandlerFactory(handlers)
                .topoOverlayFactory(overlays)
                .build();
    }
}
