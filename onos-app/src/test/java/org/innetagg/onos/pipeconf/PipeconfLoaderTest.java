package org.innetagg.onos.pipeconf;

import org.junit.Before;
import org.junit.Test;
import org.onosproject.net.driver.DefaultDriver;
import org.onosproject.net.driver.Driver;
import org.onosproject.net.driver.DriverAdminServiceAdapter;
import org.onosproject.net.driver.DriverProvider;
import org.onosproject.net.pi.model.PiPipeconf;
import org.onosproject.net.pi.model.PiPipeconfId;
import org.onosproject.net.pi.PiPipeconfServiceAdapter;

import java.util.HashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.stream.Collectors;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;

/**
 * Registration of the pipeconf, and the drivers ONOS merged from an earlier registration
 * (which ONOS 2.7 keeps, so a reinstalled app's devices would run the old bundle's classes).
 */
public class PipeconfLoaderTest {

    private final Set<DriverProvider> providers = new LinkedHashSet<>();
    private final Map<PiPipeconfId, PiPipeconf> pipeconfs = new HashMap<>();
    private PipeconfLoader loader;

    private static DriverProvider provider(String... names) {
        Set<Driver> drivers = new LinkedHashSet<>();
        for (String n : names) {
            drivers.add(new DefaultDriver(n, List.of(), "mfr", "hw", "sw", Map.of(), Map.of()));
        }
        return () -> drivers;
    }

    private Set<String> driverNames() {
        return providers.stream().flatMap(p -> p.getDrivers().stream())
                .map(Driver::name).collect(Collectors.toSet());
    }

    @Before
    public void setUp() {
        loader = new PipeconfLoader();
        loader.driverAdminService = new DriverAdminServiceAdapter() {
            @Override
            public Set<DriverProvider> getProviders() {
                return Set.copyOf(providers);
            }

            @Override
            public void registerProvider(DriverProvider provider) {
                providers.add(provider);
            }

            @Override
            public void unregisterProvider(DriverProvider provider) {
                providers.remove(provider);
            }
        };
        loader.pipeconfService = new PiPipeconfServiceAdapter() {
            @Override
            public void register(PiPipeconf pipeconf) {
                pipeconfs.put(pipeconf.id(), pipeconf);
            }

            @Override
            public void unregister(PiPipeconfId id) {
                pipeconfs.remove(id);
            }

            @Override
            public Optional<PiPipeconf> getPipeconf(PiPipeconfId id) {
                return Optional.ofNullable(pipeconfs.get(id));
            }
        };
        providers.add(provider("bmv2", "stratum-bmv2"));
        providers.add(provider("bmv2:org.innetagg.bmv2"));
        providers.add(provider("bmv2:org.onosproject.pipelines.basic"));
    }

    @Test
    public void activateDropsDriversMergedFromAnEarlierRegistration() {
        loader.activate();
        assertTrue(pipeconfs.containsKey(PipeconfLoader.PIPECONF_ID));
        assertEquals(Set.of("bmv2", "stratum-bmv2", "bmv2:org.onosproject.pipelines.basic"),
                     driverNames());
    }

    @Test
    public void deactivateUnregistersAndDropsWhatWasMergedSince() {
        loader.activate();
        providers.add(provider("stratum-bmv2:org.innetagg.bmv2"));
        loader.deactivate();
        assertTrue(pipeconfs.isEmpty());
        assertEquals(Set.of("bmv2", "stratum-bmv2", "bmv2:org.onosproject.pipelines.basic"),
                     driverNames());
    }
}
