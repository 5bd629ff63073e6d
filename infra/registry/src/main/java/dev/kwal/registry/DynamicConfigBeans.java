package dev.kwal.registry;

import io.apicurio.common.apps.config.DynamicConfigPropertyList;
import io.apicurio.common.apps.config.DynamicConfigStorageAccessor;
import io.apicurio.registry.storage.RegistryStorage;
import io.apicurio.registry.types.Current;
import io.quarkus.arc.Unremovable;
import java.util.List;
import javax.enterprise.inject.Instance;
import javax.enterprise.inject.Produces;
import javax.inject.Inject;
import javax.inject.Singleton;

/**
 * The two beans Apicurio's config-index Quarkus extension would create at build time. Its
 * deployment half (apicurio-common-app-components-config-index-deployment) is not on Maven
 * Central, so the pom leaves the extension out and this class stands in for it: no property
 * is dynamic (kwal configures the registry at start only), and the dynamic-config storage is
 * the registry's own storage (its RegistryStorageProducer's @Current bean).
 */
@Singleton
public class DynamicConfigBeans {

    @Inject
    @Current
    Instance<RegistryStorage> storage;

    @Produces
    @Singleton
    @Unremovable
    DynamicConfigPropertyList dynamicProperties() {
        return new DynamicConfigPropertyList(List.of());
    }

    @Produces
    @Singleton
    @Unremovable
    DynamicConfigStorageAccessor dynamicConfigStorage() {
        return () -> storage.get();
    }
}
