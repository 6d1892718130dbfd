package org.innetagg.onos.owner;

import org.onosproject.store.serializers.KryoNamespaces;
import org.onosproject.store.service.ConsistentMap;
import org.onosproject.store.service.Serializer;
import org.onosproject.store.service.StorageService;
import org.onosproject.store.service.Versioned;
import org.osgi.service.component.annotations.Activate;
import org.osgi.service.component.annotations.Component;
import org.osgi.service.component.annotations.Reference;
import org.osgi.service.component.annotations.ReferenceCardinality;

import java.util.Optional;
import java.util.function.LongSupplier;

/**
 * The owner claim in a consistent map of ONOS's distributed store, changed only by
 * compare-and-set at the version read: two optimizers claiming at once on two nodes cannot
 * both win. The value is {@code owner|holder|expiry ms}; expiry is the deciding node's clock
 * (nodes of a cluster keep theirs in step by NTP; the TTL is tens of seconds).
 */
@Component(immediate = true, service = OwnerService.class)
public class OwnerManager implements OwnerService {
    static final String MAP = "innet-agg-owner";
    static final String KEY = "owner";

    @Reference(cardinality = ReferenceCardinality.MANDATORY)
    protected StorageService storageService;

    /** Milliseconds; tests replace it. */
    protected LongSupplier clock = System::currentTimeMillis;
    private ConsistentMap<String, String> map;

    @Activate
    protected void activate() {
        map = storageService.<String, String>consistentMapBuilder()
                .withName(MAP)
                .withSerializer(Serializer.using(KryoNamespaces.API))
                .build();
    }

    @Override
    public Claim claim(String owner, String holder, long ttlMs) throws Taken {
        for (;;) {
            long now = clock.getAsLong();
            Versioned<String> v = map.get(KEY);
            Claim held = v == null ? null : decode(v.value(), now);
            if (held != null && held.expiresInMs > 0 && !held.owner.equals(owner)) {
                throw new Taken(held);
            }
            String value = owner + "|" + holder + "|" + (now + ttlMs);
            boolean landed = v == null ? map.putIfAbsent(KEY, value) == null : map.replace(KEY, v.version(), value);
            if (landed) {
                return new Claim(owner, holder, ttlMs);
            }
        }
    }

    @Override
    public Optional<Claim> current() {
        long now = clock.getAsLong();
        Versioned<String> v = map.get(KEY);
        Claim held = v == null ? null : decode(v.value(), now);
        return held == null || held.expiresInMs <= 0 ? Optional.empty() : Optional.of(held);
    }

    @Override
    public boolean release(String owner) {
        for (;;) {
            Versioned<String> v = map.get(KEY);
            if (v == null || !decode(v.value(), 0).owner.equals(owner)) {
                return false;
            }
            if (map.remove(KEY, v.version())) {
                return true;
            }
        }
    }

    private static Claim decode(String value, long now) {
        String[] f = value.split("\\|", 3);
        return new Claim(f[0], f[1], Long.parseLong(f[2]) - now);
    }
}
