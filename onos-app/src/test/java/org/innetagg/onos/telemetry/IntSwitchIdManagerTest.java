package org.innetagg.onos.telemetry;

import com.fasterxml.jackson.databind.ObjectMapper;
import org.innetagg.onos.TestElements;
import org.junit.Before;
import org.junit.Test;
import org.onosproject.net.Device;
import org.onosproject.net.DeviceId;
import org.onosproject.net.device.DeviceServiceAdapter;
import org.onosproject.store.service.ConsistentMap;
import org.onosproject.store.service.ConsistentMapBuilder;
import org.onosproject.store.service.StorageService;
import org.onosproject.store.service.TestConsistentMap;
import org.onosproject.store.service.TestStorageService;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNotEquals;
import static org.junit.Assert.assertTrue;

/** INT node IDs: taken from annotations, else given out and published through netcfg. */
public class IntSwitchIdManagerTest {
    private static final DeviceId S1 = DeviceId.deviceId("device:bmv2:s1");
    private static final DeviceId S2 = DeviceId.deviceId("device:bmv2:s2");
    private static final DeviceId S3 = DeviceId.deviceId("device:bmv2:s3");

    private final List<Device> devices = new ArrayList<>();
    private InMemoryNetworkConfig netcfg;
    private IntSwitchIdManager ids;

    private void device(DeviceId id, String... annotations) {
        devices.add(TestElements.device(id, annotations));
    }

    @Before
    public void setUp() {
        netcfg = new InMemoryNetworkConfig();
        ids = manager(netcfg, new SharedStorage());
    }

    private IntSwitchIdManager manager(InMemoryNetworkConfig cfg, StorageService storage) {
        IntSwitchIdManager m = new IntSwitchIdManager();
        m.netcfgService = cfg;
        m.storageService = storage;
        m.deviceService = new DeviceServiceAdapter() {
            @Override
            public Iterable<Device> getDevices() {
                return List.copyOf(devices);
            }
        };
        m.activate();
        return m;
    }

    /** ONOS's test storage, but maps of one name are one map, as in a cluster's store. */
    static final class SharedStorage extends TestStorageService {
        private final Map<String, ConsistentMap<?, ?>> maps = new HashMap<>();

        @Override
        @SuppressWarnings("unchecked")
        public <K, V> ConsistentMapBuilder<K, V> consistentMapBuilder() {
            return new TestConsistentMap.Builder<K, V>() {
                @Override
                public ConsistentMap<K, V> build() {
                    return (ConsistentMap<K, V>) maps.computeIfAbsent(name(), n -> super.build());
                }
            };
        }
    }

    @Test
    public void twoInstancesOfAClusterNeverGiveOutOneNumberTwice() {
        device(S1);
        device(S2);
        SharedStorage store = new SharedStorage();
        // Each instance's netcfg view lags: the published annotations have not arrived yet.
        IntSwitchIdManager a = manager(new InMemoryNetworkConfig(), store);
        IntSwitchIdManager b = manager(new InMemoryNetworkConfig(), store);
        assertEquals(1, a.switchId(S1));
        assertEquals(2, b.switchId(S2));
        assertEquals(1, b.switchId(S1));  // the number the other instance gave
        assertEquals(Map.of(S1, 1, S2, 2), a.switchIds());
    }

    @Test
    public void givesLowestFreeNumbersAndPublishesThem() {
        device(S1);
        device(S2, "managementAddress", "grpc://127.0.0.1:50002?device_id=1");
        assertEquals(1, ids.switchId(S1));
        assertEquals(2, ids.switchId(S2));
        assertEquals(1, ids.switchId(S1));  // stable
        assertEquals("1", netcfg.annotations.get(S1).path("entries").path("intSwitchId").asText());
        assertEquals("2", netcfg.annotations.get(S2).path("entries").path("intSwitchId").asText());
        assertEquals(2, netcfg.applied);
    }

    @Test
    public void keepsAnOperatorsNumberAndSkipsItWhenGivingOut() {
        device(S1, "intSwitchId", "1");
        device(S2);
        assertEquals(2, ids.switchId(S2));
        assertEquals(1, ids.switchId(S1));
        assertEquals(1, netcfg.applied);  // S1's number was already published
    }

    @Test
    public void aNumberTwoDevicesClaimIsReplacedForTheOneAsking() {
        device(S1, "intSwitchId", "5");
        device(S2, "intSwitchId", "5");
        device(S3, "intSwitchId", "not-a-number");
        int s2 = ids.switchId(S2);
        assertNotEquals(5, s2);
        assertEquals(1, s2);
        assertEquals(2, ids.switchId(S3));
    }

    @Test
    public void aHeldNumberIsPublishedAgainWhenItsNetcfgWasRemoved() {
        device(S1);
        assertEquals(1, ids.switchId(S1));
        assertEquals(1, ids.switchId(S1));
        assertEquals(1, netcfg.applied);  // held and published: nothing to do
        netcfg.annotations.remove(S1);  // the device's netcfg deleted, the store keeps S1 -> 1
        assertEquals(1, ids.switchId(S1));
        assertEquals("1", netcfg.annotations.get(S1).path("entries").path("intSwitchId").asText());
        assertEquals(2, netcfg.applied);
    }

    @Test
    public void publishingKeepsTheOperatorsOtherAnnotations() throws Exception {
        device(S1);
        netcfg.annotations.put(S1, new ObjectMapper().readTree("{\"entries\": {\"name\": \"leaf-1\"}}"));
        assertEquals(1, ids.switchId(S1));
        assertEquals("leaf-1", netcfg.annotations.get(S1).path("entries").path("name").asText());
        assertEquals("1", netcfg.annotations.get(S1).path("entries").path("intSwitchId").asText());
    }

    @Test
    public void numbersSetInNetcfgButNotYetOnTheDeviceAreTaken() throws Exception {
        device(S1);
        device(S2);
        netcfg.annotations.put(S1, new ObjectMapper().readTree("{\"entries\": {\"intSwitchId\": \"1\"}}"));
        assertEquals(2, ids.switchId(S2));
        assertEquals(1, ids.switchId(S1));
        assertTrue(ids.switchIds().values().containsAll(List.of(1, 2)));
    }
}
