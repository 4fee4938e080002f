//! The template engine of kms-operator. Lands with the templating issue.
