"""The syncer: applies rendered works to member clusters and reports them back."""
