package dev.kwal.registry;

import io.apicurio.common.apps.config.DynamicConfigPropertyList;
import io.quarkus.arc.Unremovable;
import java.util.List;
import javax.enterprise.inject.Produces;
import javax.inject.Singleton;

/**
 * The bean Apicurio's config-index Quarkus extension would create at build time: the list of
 * configuration properties an admin may change while the registry runs. The extension's
 * build half (apicurio-common-app-components-config-index-deployment) is not on Maven
 * Central, so the pom leaves the extension out and this class stands in for it: no property
 * is dynamic (kwal configures the registry when it starts, only).
 */
@Singleton
public class DynamicConfigBeans {

    @Produces
    @Singleton
    @Unremovable
    DynamicConfigPropertyList dynamicProperties() {
        return new DynamicConfigPropertyList(List.of());
    }
}
