"""Protocol buffer sources of agentrl's wire and storage schemas, shipped with the package."""
