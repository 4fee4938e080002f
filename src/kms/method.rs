//! The login methods, named once: each method's metric label, the strategy
//! name conditions show and the route it logs in on come from
//! [`LoginMethod`], so a new method is one variant here plus its proof.

/// How an identity logs in to the KMS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LoginMethod {
    /// Universal auth (`universalAuth`): client id and secret.
    Universal,
    /// Kubernetes auth (`kubernetesAuth`): a service-account token.
    Kubernetes,
    /// AWS IAM (`awsIamAuth`).
    AwsIam,
    /// Azure managed identity (`azureAuth`).
    Azure,
    /// GCP identity token from the metadata server (`gcpIdTokenAuth`).
    GcpIdToken,
    /// GCP service-account key file (`gcpIamAuth`).
    GcpIam,
    /// LDAP (`ldapAuth`).
    Ldap,
    /// A legacy service token (`serviceToken`): no login.
    ServiceToken,
}

impl LoginMethod {
    /// Every method, in the order metrics list them.
    pub const ALL: [LoginMethod; 8] = [
        LoginMethod::Universal,
        LoginMethod::Kubernetes,
        LoginMethod::AwsIam,
        LoginMethod::Azure,
        LoginMethod::GcpIdToken,
        LoginMethod::GcpIam,
        LoginMethod::Ldap,
        LoginMethod::ServiceToken,
    ];

    /// The metric label (`kms_operator_kms_logins_total{method}`).
    pub fn label(self) -> &'static str {
        match self {
            LoginMethod::Universal => "universal",
            LoginMethod::Kubernetes => "kubernetes",
            LoginMethod::AwsIam => "aws-iam",
            LoginMethod::Azure => "azure",
            LoginMethod::GcpIdToken => "gcp-id-token",
            LoginMethod::GcpIam => "gcp-iam",
            LoginMethod::Ldap => "ldap",
            LoginMethod::ServiceToken => "service-token",
        }
    }

    /// The strategy name shown in conditions (the Go operators' names).
    pub fn strategy_name(self) -> &'static str {
        match self {
            LoginMethod::Universal => "UNIVERSAL_MACHINE_IDENTITY",
            LoginMethod::Kubernetes => "KUBERNETES_AUTH_MACHINE_IDENTITY",
            LoginMethod::AwsIam => "AWS_IAM_MACHINE_IDENTITY",
            LoginMethod::Azure => "AZURE_MACHINE_IDENTITY",
            LoginMethod::GcpIdToken => "GCP_ID_TOKEN_MACHINE_IDENTITY",
            LoginMethod::GcpIam => "GCP_IAM_MACHINE_IDENTITY",
            LoginMethod::Ldap => "LDAP_MACHINE_IDENTITY",
            LoginMethod::ServiceToken => "SERVICE_TOKEN",
        }
    }

    /// The login route as a metric label and its path under the API base;
    /// `None` for a service token, which never logs in.
    pub fn route(self) -> Option<(&'static str, &'static str)> {
        Some(match self {
            LoginMethod::Universal => (
                "POST /api/v1/auth/universal-auth/login",
                "/v1/auth/universal-auth/login",
            ),
            LoginMethod::Kubernetes => (
                "POST /api/v1/auth/kubernetes-auth/login",
                "/v1/auth/kubernetes-auth/login",
            ),
            LoginMethod::AwsIam => (
                "POST /api/v1/auth/aws-auth/login",
                "/v1/auth/aws-auth/login",
            ),
            LoginMethod::Azure => (
                "POST /api/v1/auth/azure-auth/login",
                "/v1/auth/azure-auth/login",
            ),
            LoginMethod::GcpIdToken | LoginMethod::GcpIam => (
                "POST /api/v1/auth/gcp-auth/login",
                "/v1/auth/gcp-auth/login",
            ),
            LoginMethod::Ldap => (
                "POST /api/v1/auth/ldap-auth/login",
                "/v1/auth/ldap-auth/login",
            ),
            LoginMethod::ServiceToken => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_names_are_distinct() {
        let labels: std::collections::HashSet<_> =
            LoginMethod::ALL.iter().map(|m| m.label()).collect();
        let names: std::collections::HashSet<_> =
            LoginMethod::ALL.iter().map(|m| m.strategy_name()).collect();
        assert_eq!(labels.len(), LoginMethod::ALL.len());
        assert_eq!(names.len(), LoginMethod::ALL.len());
    }

    #[test]
    fn login_routes_are_not_listed_with_the_other_endpoints() {
        for m in LoginMethod::ALL {
            if let Some((route, path)) = m.route() {
                assert!(
                    !crate::metrics::KMS_ENDPOINTS.contains(&route),
                    "{route} is listed twice"
                );
                assert_eq!(route, format!("POST /api{path}"));
            }
        }
    }
}
