package org.innetagg.onos.pipeconf;

import org.onosproject.net.behaviour.Pipeliner;
import org.onosproject.net.behaviour.inbandtelemetry.IntProgrammable;
import org.onosproject.net.driver.DriverAdminService;
import org.onosproject.net.driver.DriverProvider;
import org.onosproject.net.pi.model.DefaultPiPipeconf;
import org.onosproject.net.pi.model.PiPipeconf;
import org.onosproject.net.pi.model.PiPipeconfId;
import org.onosproject.net.pi.model.PiPipelineInterpreter;
import org.onosproject.net.pi.model.PiPipelineModel;
import org.onosproject.net.pi.service.PiPipeconfService;
import org.onosproject.p4runtime.model.P4InfoParser;
import org.onosproject.p4runtime.model.P4InfoParserException;
import org.osgi.service.component.annotations.Activate;
import org.osgi.service.component.annotations.Component;
import org.osgi.service.component.annotations.Deactivate;
import org.osgi.service.component.annotations.Reference;
import org.osgi.service.component.annotations.ReferenceCardinality;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.net.URL;
import java.util.Set;

import static org.onosproject.net.pi.model.PiPipeconf.ExtensionType.BMV2_JSON;
import static org.onosproject.net.pi.model.PiPipeconf.ExtensionType.P4_INFO_TEXT;

/**
 * Registers the innet_agg pipeline (p4/build, bundled under /p4) for bmv2 devices. A device
 * uses it when its netcfg names {@link #PIPECONF_ID} as its pipeconf.
 */
@Component(immediate = true)
public final class PipeconfLoader {

    public static final PiPipeconfId PIPECONF_ID = new PiPipeconfId("org.innetagg.bmv2");
    static final String BMV2_JSON_PATH = "/p4/innet_agg.json";
    static final String P4INFO_PATH = "/p4/innet_agg.p4info.txt";

    private final Logger log = LoggerFactory.getLogger(getClass());

    @Reference(cardinality = ReferenceCardinality.MANDATORY)
    protected PiPipeconfService pipeconfService;

    @Reference(cardinality = ReferenceCardinality.MANDATORY)
    protected DriverAdminService driverAdminService;

    @Activate
    protected void activate() {
        // A stale registration survives a crashed deactivate; registering twice throws.
        if (pipeconfService.getPipeconf(PIPECONF_ID).isPresent()) {
            pipeconfService.unregister(PIPECONF_ID);
        }
        dropMergedDrivers();
        pipeconfService.register(buildPipeconf());
        log.info("Registered pipeconf {}", PIPECONF_ID);
    }

    @Deactivate
    protected void deactivate() {
        pipeconfService.unregister(PIPECONF_ID);
        dropMergedDrivers();
        log.info("Unregistered pipeconf {}", PIPECONF_ID);
    }

    /**
     * Removes the drivers ONOS merged from our pipeconf with a device's base driver
     * ({@code bmv2:org.innetagg.bmv2}). ONOS 2.7 keeps them after the pipeconf is unregistered
     * (PiPipeconfManager.unregister: "TODO add mechanism to remove from device") and reuses one
     * by name: after this app is upgraded or reinstalled, devices would go on running the
     * behaviours of the uninstalled bundle, whose service lookups fail (seen in a real ONOS:
     * "INT init failed: Service ...IntSwitchIdService not found"). Without them ONOS merges
     * again from the pipeconf registered now, at the next driver lookup.
     */
    void dropMergedDrivers() {
        String suffix = ":" + PIPECONF_ID.id();
        int dropped = 0;
        for (DriverProvider provider : Set.copyOf(driverAdminService.getProviders())) {
            Set<?> drivers = provider.getDrivers();
            if (!drivers.isEmpty() && provider.getDrivers().stream()
                    .allMatch(d -> d.name().endsWith(suffix))) {
                driverAdminService.unregisterProvider(provider);
                dropped++;
            }
        }
        if (dropped > 0) {
            log.info("Dropped {} driver(s) merged from an earlier {}", dropped, PIPECONF_ID);
        }
    }

    /** The pipeconf: the model parsed from the bundled P4Info, our behaviours, bmv2's JSON. */
    public static PiPipeconf buildPipeconf() {
        URL p4Info = resource(P4INFO_PATH);
        return DefaultPiPipeconf.builder()
                .withId(PIPECONF_ID)
                .withPipelineModel(pipelineModel(p4Info))
                .addBehaviour(PiPipelineInterpreter.class, InterpreterImpl.class)
                .addBehaviour(Pipeliner.class, PipelinerImpl.class)
                .addBehaviour(IntProgrammable.class, IntProgrammableImpl.class)
                .addExtension(P4_INFO_TEXT, p4Info)
                .addExtension(BMV2_JSON, resource(BMV2_JSON_PATH))
                .build();
    }

    /** ONOS's own P4Info parser: the model ONOS checks every flow rule against. */
    public static PiPipelineModel pipelineModel(URL p4Info) {
        try {
            return P4InfoParser.parse(p4Info);
        } catch (P4InfoParserException e) {
            throw new IllegalStateException("cannot parse " + p4Info + ": " + e.getMessage(), e);
        }
    }

    private static URL resource(String path) {
        URL url = PipeconfLoader.class.getResource(path);
        if (url == null) {
            throw new IllegalStateException(path + " missing from the bundle (built without p4/build?)");
        }
        return url;
    }
}
