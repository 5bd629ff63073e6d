"""The schema registry the change stream registers its schemas in (infra.registry.apicurio)."""
