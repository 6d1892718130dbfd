package org.innetagg.onos.ui;

import org.junit.Assume;
import org.junit.Test;

import java.io.File;
import java.io.IOException;
import java.net.URL;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.concurrent.TimeUnit;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNotNull;
import static org.junit.Assert.assertTrue;

/**
 * Runs src/test/js (the overlay's scripts against a stand-in of ONOS's GUI services, see
 * there) on the scripts as built into target/classes. Skipped, saying so, without Node.
 */
public class OverlayScriptTest {

    @Test
    public void overlayScriptsPassTheirNodeTests() throws Exception {
        Assume.assumeTrue("node is not installed: the overlay's script tests (src/test/js) did not run",
                          nodeAvailable());
        URL script = getClass().getClassLoader()
                .getResource("app/view/" + AggregationUiComponent.VIEW_ID + "/innetAggTopov.js");
        assertNotNull("overlay script not on the classpath", script);
        Path viewDir = Paths.get(script.toURI()).getParent();
        Path tests = Paths.get(System.getProperty("basedir", "."), "src", "test", "js");

        ProcessBuilder pb = new ProcessBuilder("node", "--test", tests.toString()).redirectErrorStream(true);
        pb.environment().put("INNETAGG_VIEW_DIR", viewDir.toString());
        File out = File.createTempFile("innetagg-node", ".tap");
        out.deleteOnExit();
        pb.redirectOutput(out);
        Process p = pb.start();
        assertTrue("node --test did not finish in 60 s", p.waitFor(60, TimeUnit.SECONDS));
        String tap = java.nio.file.Files.readString(out.toPath(), StandardCharsets.UTF_8);
        assertEquals("node --test failed:\n" + tap, 0, p.exitValue());
        assertTrue("no script test ran:\n" + tap, tap.contains("# pass ") && !tap.contains("# pass 0"));
    }

    private static boolean nodeAvailable() {
        try {
            Process p = new ProcessBuilder("node", "--version").redirectErrorStream(true).start();
            return p.waitFor(10, TimeUnit.SECONDS) && p.exitValue() == 0;
        } catch (IOException e) {
            return false;
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return false;
        }
    }
}
