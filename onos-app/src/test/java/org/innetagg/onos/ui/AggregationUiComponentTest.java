package org.innetagg.onos.ui;

import org.junit.Before;
import org.junit.Test;
import org.onosproject.ui.UiExtension;
import org.onosproject.ui.UiExtensionServiceAdapter;
import org.onosproject.ui.UiMessageHandler;
import org.onosproject.ui.UiTopoOverlay;
import org.onosproject.ui.UiView;

import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.TreeSet;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Collectors;

import static org.innetagg.onos.ui.AggregationUiComponent.VIEW_ID;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNotNull;
import static org.junit.Assert.assertSame;
import static org.junit.Assert.assertTrue;

/**
 * The UI extension as ONOS's legacy GUI loads it: index.html includes {@code <VIEW_ID>/js.html}
 * and {@code css.html}, the browser then fetches {@code app/view/<view>/<file>}, which the GUI
 * serves as {@code extension.resource(view, file)}; onos.js requires the Angular module
 * "ov" + capitalised view id. Read through the extension's class loader, as the GUI does.
 */
public class AggregationUiComponentTest {
    private static final String PREFIX = "app/view/" + VIEW_ID + "/";

    private final List<UiExtension> registered = new ArrayList<>();
    private final List<UiExtension> unregistered = new ArrayList<>();
    private AggregationUiComponent component;
    private UiExtension extension;

    @Before
    public void setUp() {
        component = new AggregationUiComponent();
        component.aggregationService = new UiTestTopology.Placements();
        component.uiExtensionService = new UiExtensionServiceAdapter() {
            @Override
            public void register(UiExtension extension) {
                registered.add(extension);
            }

            @Override
            public void unregister(UiExtension extension) {
                unregistered.add(extension);
            }
        };
        component.activate();
        extension = registered.get(0);
    }

    @Test
    public void activateRegistersTheExtensionAndDeactivateRemovesIt() {
        assertEquals(1, registered.size());
        component.deactivate();
        assertEquals(1, unregistered.size());
        assertSame(extension, unregistered.get(0));
    }

    @Test
    public void theHiddenViewCarriesTheScripts() {
        List<String> views = extension.views().stream().map(UiView::id).collect(Collectors.toList());
        assertEquals(List.of(VIEW_ID), views);
    }

    @Test
    public void everyIncludedFileIsServedFromTheView() throws IOException {
        List<String> files = new ArrayList<>();
        files.addAll(refs(read(extension.js()), "src"));
        files.addAll(refs(read(extension.css()), "href"));
        assertEquals(List.of(PREFIX + "innetAggTopov.js", PREFIX + "innetAggTopovOverlay.js",
                             PREFIX + "innetAggTopov.css"), files);
        for (String file : files) {
            String text = read(extension.resource(VIEW_ID, file.substring(PREFIX.length())));
            assertFalse(file + " is empty", text.isBlank());
        }
    }

    @Test
    public void theScriptsDefineTheModuleOnosRequires() throws IOException {
        String module = "ov" + Character.toUpperCase(VIEW_ID.charAt(0)) + VIEW_ID.substring(1);
        assertTrue(script("innetAggTopov.js").contains("angular.module('" + module + "', [])"));
        assertTrue(script("innetAggTopovOverlay.js").contains("angular.module('" + module + "')"));
    }

    @Test
    public void theOverlayIdIsTheSameInJavaAndJavaScript() throws IOException {
        Matcher m = Pattern.compile("overlayId:\\s*'([^']+)'").matcher(script("innetAggTopovOverlay.js"));
        assertTrue(m.find());
        assertEquals(AggregationTopoOverlay.OVERLAY_ID, m.group(1));
        List<UiTopoOverlay> overlays = new ArrayList<>(extension.topoOverlayFactory().newOverlays());
        assertEquals(1, overlays.size());
        assertEquals(AggregationTopoOverlay.OVERLAY_ID, overlays.get(0).id());
    }

    @Test
    public void theScriptSendsWhatTheHandlerHandlesAndBindsWhatItAnswers() throws IOException {
        String js = script("innetAggTopov.js");
        // The requests: the values of the script's "req" object.
        String req = js.substring(js.indexOf("var req = {"), js.indexOf("};", js.indexOf("var req = {")));
        Set<String> named = new TreeSet<>();
        Matcher m = Pattern.compile(":\\s*'(innetAgg[A-Za-z]+)'").matcher(req);
        while (m.find()) {
            named.add(m.group(1));
        }
        List<UiMessageHandler> handlers = new ArrayList<>(extension.messageHandlerFactory().newHandlers());
        assertEquals(1, handlers.size());
        UiMessageHandler handler = handlers.get(0);
        handler.init(new UiTestTopology.Browser(),
                     UiTestTopology.directory(new UiTestTopology.Placements(), new UiTestTopology.ShortestPaths()));
        assertEquals(handler.messageTypes(), named);
        assertTrue(js.contains(AggregationTopoMessageHandler.JOB + ": onJob"));
        assertTrue(js.contains(AggregationTopoMessageHandler.ERROR + ": onError"));
    }

    private String script(String name) throws IOException {
        return read(extension.resource(VIEW_ID, name));
    }

    private static String read(InputStream in) throws IOException {
        assertNotNull("resource not found", in);
        try (in) {
            return new String(in.readAllBytes(), StandardCharsets.UTF_8);
        }
    }

    private static List<String> refs(String html, String attribute) {
        List<String> out = new ArrayList<>();
        Matcher m = Pattern.compile(attribute + "=\"([^\"]+)\"").matcher(html);
        while (m.find()) {
            out.add(m.group(1));
        }
        return out;
    }
}
