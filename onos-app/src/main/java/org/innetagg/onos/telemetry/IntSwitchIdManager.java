package org.innetagg.onos.telemetry;

import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.onosproject.net.Device;
import org.onosproject.net.DeviceId;
import org.onosproject.net.config.NetworkConfigService;
import org.onosproject.net.config.basics.DeviceAnnotationConfig;
import org.onosproject.net.device.DeviceService;
import org.onosproject.store.serializers.KryoNamespaces;
import org.onosproject.store.service.ConsistentMap;
import org.onosproject.store.service.Serializer;
import org.onosproject.store.service.StorageService;
import org.onosproject.store.service.Versioned;
import org.osgi.service.component.annotations.Activate;
import org.osgi.service.component.annotations.Component;
import org.osgi.service.component.annotations.Reference;
import org.osgi.service.component.annotations.ReferenceCardinality;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.util.HashMap;
import java.util.Map;
import java.util.Optional;

/**
 * Gives out INT node IDs and publishes them as the {@value IntSwitchIdService#ANNOTATION}
 * device annotation through ONOS's network configuration (key {@code annotations}). Who owns
 * which number is a consistent map in ONOS's distributed store: taking a number is one
 * {@code putIfAbsent}, so two instances of a cluster never give out the same one, and a
 * restart of this app finds its earlier numbers there.
 *
 * <p>Why not derive the number from the device: a bmv2 device's P4Runtime {@code device_id}
 * is 1 on every switch that has its own gRPC server, and device names carry no number.
 */
@Component(immediate = true, service = IntSwitchIdService.class)
public class IntSwitchIdManager implements IntSwitchIdService {

    private final Logger log = LoggerFactory.getLogger(getClass());

    @Reference(cardinality = ReferenceCardinality.MANDATORY)
    public DeviceService deviceService;

    @Reference(cardinality = ReferenceCardinality.MANDATORY)
    public NetworkConfigService netcfgService;

    @Reference(cardinality = ReferenceCardinality.MANDATORY)
    public StorageService storageService;

    /** Node ID -> the device that owns it, cluster-wide. */
    private ConsistentMap<Integer, DeviceId> owners;

    @Activate
    public void activate() {
        owners = storageService.<Integer, DeviceId>consistentMapBuilder()
                .withName("innet-agg-int-switch-ids")
                .withSerializer(Serializer.using(KryoNamespaces.API))
                .build();
    }

    @Override
    public synchronized int switchId(DeviceId deviceId) {
        Map<DeviceId, Integer> held = switchIds();
        if (held.containsKey(deviceId)) {
            int id = held.get(deviceId);
            // The number outlives its annotation when the device's netcfg is removed (a device
            // deleted and added again): publish it again, or telemetry stays unmapped.
            if (!published(deviceId, id)) {
                publish(deviceId, id);
            }
            return id;
        }
        Map<DeviceId, Integer> claimed = claimed();
        Integer own = claimed.get(deviceId);
        if (own != null && claimed.entrySet().stream()
                .noneMatch(e -> !e.getKey().equals(deviceId) && e.getValue().equals(own))
                && take(own, deviceId)) {
            return own;
        }
        if (own != null) {
            log.warn("{}: {}={} is claimed by another device too; giving a new number",
                    deviceId, ANNOTATION, own);
        }
        int id = 1;
        while (claimed.containsValue(id) || !take(id, deviceId)) {
            id++;
        }
        publish(deviceId, id);
        log.info("{}: INT node ID {}", deviceId, id);
        return id;
    }

    /** Atomically, cluster-wide: true when `id` is now (or already was) the device's. */
    private boolean take(int id, DeviceId deviceId) {
        Versioned<DeviceId> before = owners.putIfAbsent(id, deviceId);
        return before == null || before.value().equals(deviceId);
    }

    @Override
    public Map<DeviceId, Integer> switchIds() {
        Map<DeviceId, Integer> out = new HashMap<>();
        owners.entrySet().forEach(e -> out.put(e.getValue().value(), e.getKey()));
        return Map.copyOf(out);
    }

    /** Numbers in use: owned in the map, annotated on a device, or set in netcfg not yet applied. */
    private Map<DeviceId, Integer> claimed() {
        Map<DeviceId, Integer> out = new HashMap<>(switchIds());
        for (Device d : deviceService.getDevices()) {
            parse(d.annotations().value(ANNOTATION)).ifPresent(n -> out.put(d.id(), n));
        }
        for (DeviceId id : netcfgService.getSubjects(DeviceId.class, DeviceAnnotationConfig.class)) {
            DeviceAnnotationConfig cfg = netcfgService.getConfig(id, DeviceAnnotationConfig.class);
            if (cfg != null) {
                parse(cfg.annotations().get(ANNOTATION)).ifPresent(n -> out.put(id, n));
            }
        }
        return out;
    }

    /** Whether the device, or its netcfg waiting to be applied, carries `id` already. */
    private boolean published(DeviceId deviceId, int id) {
        Device device = deviceService.getDevice(deviceId);
        if (device != null && parse(device.annotations().value(ANNOTATION)).orElse(-1) == id) {
            return true;
        }
        DeviceAnnotationConfig cfg = netcfgService.getConfig(deviceId, DeviceAnnotationConfig.class);
        return cfg != null && parse(cfg.annotations().get(ANNOTATION)).orElse(-1) == id;
    }

    static Optional<Integer> parse(String value) {
        if (value == null) {
            return Optional.empty();
        }
        try {
            long n = Long.parseLong(value.trim());
            return n >= 1 && n <= Integer.MAX_VALUE ? Optional.of((int) n) : Optional.empty();
        } catch (NumberFormatException e) {
            return Optional.empty();
        }
    }

    /** Adds the annotation to the device's annotations config, keeping the operator's entries. */
    private void publish(DeviceId deviceId, int id) {
        DeviceAnnotationConfig cfg = netcfgService.getConfig(deviceId, DeviceAnnotationConfig.class);
        ObjectNode json = cfg != null && cfg.node().isObject()
                ? ((ObjectNode) cfg.node()).deepCopy() : JsonNodeFactory.instance.objectNode();
        ObjectNode entries = json.has("entries") && json.get("entries").isObject()
                ? (ObjectNode) json.get("entries") : json.putObject("entries");
        entries.put(ANNOTATION, Integer.toString(id));
        try {
            netcfgService.applyConfig(deviceId, DeviceAnnotationConfig.class, json);
        } catch (RuntimeException e) {
            // The number holds for this run; readers without the annotation fall back (docs).
            log.warn("{}: could not publish {}={}: {}", deviceId, ANNOTATION, id, e.getMessage());
        }
    }
}
