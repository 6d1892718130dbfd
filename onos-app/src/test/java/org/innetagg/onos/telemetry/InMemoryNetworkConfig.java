package org.innetagg.onos.telemetry;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.onosproject.net.DeviceId;
import org.onosproject.net.config.Config;
import org.onosproject.net.config.NetworkConfigListener;
import org.onosproject.net.config.NetworkConfigService;
import org.onosproject.net.config.SubjectFactory;
import org.onosproject.net.config.basics.DeviceAnnotationConfig;

import java.util.HashMap;
import java.util.Map;
import java.util.Set;

/**
 * Device annotation configs kept in a map, as ONOS's network config store keeps them (ONOS
 * itself cannot run here); the parts of {@link NetworkConfigService} the app uses.
 */
public final class InMemoryNetworkConfig implements NetworkConfigService {
    private final ObjectMapper mapper = new ObjectMapper();
    public final Map<DeviceId, JsonNode> annotations = new HashMap<>();
    public int applied;

    @Override
    @SuppressWarnings("unchecked")
    public <S, C extends Config<S>> C getConfig(S subject, Class<C> configClass) {
        JsonNode node = annotations.get(subject);
        if (configClass != DeviceAnnotationConfig.class || node == null) {
            return null;
        }
        DeviceAnnotationConfig cfg = new DeviceAnnotationConfig();
        cfg.init((DeviceId) subject, DeviceAnnotationConfig.CONFIG_KEY, node.deepCopy(), mapper, c -> { });
        return (C) cfg;
    }

    @Override
    public <S, C extends Config<S>> C applyConfig(S subject, Class<C> configClass, JsonNode json) {
        if (configClass != DeviceAnnotationConfig.class) {
            throw new UnsupportedOperationException(configClass.getName());
        }
        annotations.put((DeviceId) subject, json.deepCopy());
        applied++;
        return getConfig(subject, configClass);
    }

    @Override
    @SuppressWarnings("unchecked")
    public <S, C extends Config<S>> Set<S> getSubjects(Class<S> subjectClass, Class<C> configClass) {
        return configClass == DeviceAnnotationConfig.class ? (Set<S>) Set.copyOf(annotations.keySet()) : Set.of();
    }

    @Override
    public Set<Class> getSubjectClasses() {
        throw new UnsupportedOperationException();
    }

    @Override
    public SubjectFactory getSubjectFactory(String subjectClassKey) {
        throw new UnsupportedOperationException();
    }

    @Override
    public SubjectFactory getSubjectFactory(Class subjectClass) {
        throw new UnsupportedOperationException();
    }

    @Override
    public Class<? extends Config> getConfigClass(String subjectClassKey, String configKey) {
        throw new UnsupportedOperationException();
    }

    @Override
    public <S> Set<S> getSubjects(Class<S> subjectClass) {
        throw new UnsupportedOperationException();
    }

    @Override
    public <S> Set<? extends Config<S>> getConfigs(S subject) {
        throw new UnsupportedOperationException();
    }

    @Override
    public <S, C extends Config<S>> C addConfig(S subject, Class<C> configClass) {
        throw new UnsupportedOperationException();
    }

    @Override
    public <S, C extends Config<S>> C applyConfig(String subjectClassKey, S subject, String configKey, JsonNode json) {
        throw new UnsupportedOperationException();
    }

    @Override
    public <S, C extends Config<S>> void removeConfig(S subject, Class<C> configClass) {
        annotations.remove(subject);
    }

    @Override
    public <S> void removeConfig(String subjectClassKey, S subject, String configKey) {
        throw new UnsupportedOperationException();
    }

    @Override
    public <S> void removeConfig(S subject) {
        annotations.remove(subject);
    }

    @Override
    public <S> void removeConfig() {
        annotations.clear();
    }

    @Override
    public void addListener(NetworkConfigListener listener) {
    }

    @Override
    public void removeListener(NetworkConfigListener listener) {
    }
}
