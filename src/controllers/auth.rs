//! Turning a resource's authentication into a KMS identity: the endpoint
//! (host and CA) and the credentials, read from the referenced Secret or
//! ServiceAccount under the namespace rule, or — for the cloud methods —
//! produced at login time from the pod's cloud environment (see
//! [`crate::kms::cloud`]).
//!
//! Every method's errors name the method and the object: "credentials Secret
//! ns/name not found", "ServiceAccount ns/name has no token Secret", and so
//! on. A Kubernetes service-account token is requested only when a login needs
//! one (TokenRequest with the configured audiences, or the legacy token
//! Secret), so the identity — and its one shared login — does not change with
//! every short-lived token.

use std::sync::Arc;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kube::api::{Api, PostParams};
use secrecy::SecretString;

use super::context::Context;
use super::error::SyncError;
use super::refs::{
    Choice, choose_endpoint, default_host, namespace_of, resolve_endpoint, secret_string,
};
use crate::api::common::{
    AwsIamAuth, AzureAuth, GcpIamAuth, GcpIdTokenAuth, GenericAuthentication, KubeSecretReference,
    KubernetesAuth, LdapAuth, Method, TlsConfig,
};
use crate::kms::auth::JwtSource;
use crate::kms::cloud::{self, CloudMethod};
use crate::kms::endpoint::host_allowed;
use crate::kms::{Credentials, Endpoint, Identity, KmsError};

/// How a resource logs in, with its references resolved to namespaces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthMethod {
    /// Universal auth from a credentials Secret `(namespace, name)`.
    Universal {
        /// The credentials Secret.
        credentials: (String, String),
    },
    /// Kubernetes auth with a ServiceAccount's token.
    Kubernetes {
        /// The machine identity.
        identity_id: String,
        /// The ServiceAccount `(namespace, name)`.
        service_account: (String, String),
        /// Request a token (TokenRequest) instead of reading the legacy
        /// token Secret.
        auto_token: bool,
        /// Audiences of a requested token.
        audiences: Vec<String>,
    },
    /// LDAP auth from a credentials Secret `(namespace, name)`.
    Ldap {
        /// The machine identity.
        identity_id: String,
        /// The credentials Secret.
        credentials: (String, String),
    },
    /// A legacy service token from a Secret `(namespace, name)`.
    ServiceToken {
        /// The Secret holding the token.
        secret: (String, String),
    },
    /// A cloud method: AWS IAM, Azure managed identity, GCP ID token or
    /// GCP IAM (key file).
    Cloud {
        /// Which method.
        method: CloudMethod,
        /// The machine identity.
        identity_id: String,
        /// Azure: the resource of the token (default
        /// `https://management.azure.com/`).
        azure_resource: Option<String>,
        /// Azure: the client id of a user-assigned managed identity.
        azure_client_id: Option<String>,
        /// GCP IAM: the key file's path (under `--key-file-dir`).
        key_file: Option<String>,
    },
    /// A method this build does not support.
    Unsupported(&'static str),
}

impl AuthMethod {
    /// The Secret `(namespace, name)` the method reads its credentials
    /// from, if any: what the reference index must know so that a change
    /// of it reaches the resource.
    pub fn secret_read(&self) -> Option<&(String, String)> {
        match self {
            AuthMethod::Universal { credentials } | AuthMethod::Ldap { credentials, .. } => {
                Some(credentials)
            }
            AuthMethod::ServiceToken { secret } => Some(secret),
            AuthMethod::Kubernetes { .. }
            | AuthMethod::Cloud { .. }
            | AuthMethod::Unsupported(_) => None,
        }
    }
}

impl AuthMethod {
    /// What to check when the KMS refused a login with this method: where
    /// its credentials come from, named.
    pub fn refused_login_fix(&self) -> Option<String> {
        Some(match self {
            AuthMethod::Universal {
                credentials: (ns, name),
            } => format!(
                "check clientId and clientSecret in Secret {ns}/{name} against the machine identity's \
                 universal auth (a client secret made anew must be copied there)"
            ),
            AuthMethod::Ldap {
                identity_id,
                credentials: (ns, name),
            } => format!(
                "check username and password in Secret {ns}/{name} and the LDAP auth of identity \
                 {identity_id}"
            ),
            AuthMethod::Kubernetes {
                identity_id,
                service_account: (ns, name),
                ..
            } => format!(
                "check that the Kubernetes auth of identity {identity_id} allows ServiceAccount \
                 {ns}/{name} (and its token's audiences)"
            ),
            AuthMethod::ServiceToken { secret: (ns, name) } => format!(
                "check the service token in Secret {ns}/{name} (kmsToken): it may be revoked or expired"
            ),
            AuthMethod::Cloud { identity_id, .. } => {
                format!("check that identity {identity_id} trusts the operator's cloud identity")
            }
            AuthMethod::Unsupported(_) => return None,
        })
    }
}

/// Read the Secret `ns/name` that holds a method's credentials (`keys`, as
/// the fix names them).
async fn credentials_secret(
    ctx: &Context,
    ns: &str,
    name: &str,
    what: &str,
    keys: &str,
) -> Result<Arc<Secret>, SyncError> {
    ctx.referenced
        .get(&ctx.client, ns, name)
        .await?
        .ok_or_else(|| SyncError::Reference {
            reason: "CredentialsNotFound",
            message: format!(
                "{what} Secret {ns}/{name} not found: create it with the keys {keys}, or point the \
                 resource's reference at the Secret that has them"
            ),
        })
}

/// The string value of the first of `keys` present (trimmed, not empty) in
/// the credentials Secret `ns/name`.
fn secret_key(
    secret: &Secret,
    ns: &str,
    name: &str,
    keys: &[&str],
    what: &str,
) -> Result<String, SyncError> {
    keys.iter()
        .find_map(|k| {
            secret_string(secret, k)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        })
        .ok_or_else(|| SyncError::Reference {
            reason: "CredentialsInvalid",
            message: format!("{what} Secret {ns}/{name} has no {} key", keys[0]),
        })
}

/// Read universal-auth credentials from the Secret `ns/name`.
pub async fn universal_credentials(
    ctx: &Context,
    ns: &str,
    name: &str,
) -> Result<Credentials, SyncError> {
    let what = "credentials";
    let secret = credentials_secret(ctx, ns, name, what, "clientId and clientSecret").await?;
    Ok(Credentials::UniversalAuth {
        client_id: secret_key(&secret, ns, name, &["clientId"], what)?,
        client_secret: secret_key(&secret, ns, name, &["clientSecret"], what)?.into(),
    })
}

/// A source of service-account tokens for `ns/name`.
fn jwt_source(
    client: kube::Client,
    ns: String,
    name: String,
    auto_token: bool,
    audiences: Vec<String>,
) -> JwtSource {
    Arc::new(move || {
        let (client, ns, name, audiences) =
            (client.clone(), ns.clone(), name.clone(), audiences.clone());
        Box::pin(async move {
            let sas = Api::<ServiceAccount>::namespaced(client.clone(), &ns);
            if auto_token {
                let request: TokenRequest = serde_json::from_value(serde_json::json!({
                    "spec": {"audiences": audiences, "expirationSeconds": 600}
                }))
                .map_err(|e| e.to_string())?;
                let issued = sas
                    .create_token_request(&name, &PostParams::default(), &request)
                    .await
                    .map_err(|e| match e {
                        kube::Error::Api(s) if s.code == 404 => {
                            format!("ServiceAccount {ns}/{name} not found")
                        }
                        other => format!(
                            "could not request a token for ServiceAccount {ns}/{name}: {other}"
                        ),
                    })?;
                let token = issued
                    .status
                    .and_then(|s| s.token)
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| {
                        format!("the TokenRequest for ServiceAccount {ns}/{name} returned no token")
                    })?;
                return Ok(SecretString::from(token));
            }
            // The legacy long-lived token Secret of the ServiceAccount.
            let sa = sas
                .get_opt(&name)
                .await
                .map_err(|e| format!("reading ServiceAccount {ns}/{name}: {e}"))?
                .ok_or_else(|| format!("ServiceAccount {ns}/{name} not found"))?;
            let secret_name = sa
                .secrets
                .unwrap_or_default()
                .into_iter()
                .find_map(|r| r.name)
                .ok_or_else(|| {
                    format!(
                        "ServiceAccount {ns}/{name} has no token Secret; set autoCreateServiceAccountToken: true to use a requested token"
                    )
                })?;
            let secret = Api::<Secret>::namespaced(client, &ns)
                .get_opt(&secret_name)
                .await
                .map_err(|e| format!("reading Secret {ns}/{secret_name}: {e}"))?
                .ok_or_else(|| {
                    format!(
                        "token Secret {ns}/{secret_name} of ServiceAccount {ns}/{name} not found"
                    )
                })?;
            secret_string(&secret, "token")
                .map(|t| SecretString::from(t.trim().to_owned()))
                .ok_or_else(|| format!("token Secret {ns}/{secret_name} has no token key"))
        })
    })
}

/// The credentials of a method.
pub async fn credentials(ctx: &Context, method: &AuthMethod) -> Result<Credentials, SyncError> {
    match method {
        AuthMethod::Universal {
            credentials: (ns, name),
        } => universal_credentials(ctx, ns, name).await,
        AuthMethod::Kubernetes {
            identity_id,
            service_account: (ns, name),
            auto_token,
            audiences,
        } => Ok(Credentials::Kubernetes {
            identity_id: identity_id.clone(),
            subject: format!("{ns}/{name}|{}|{auto_token}", audiences.join(",")),
            jwt: jwt_source(
                ctx.client.clone(),
                ns.clone(),
                name.clone(),
                *auto_token,
                audiences.clone(),
            ),
        }),
        AuthMethod::Ldap {
            identity_id,
            credentials: (ns, name),
        } => {
            let what = "LDAP credentials";
            let secret = credentials_secret(ctx, ns, name, what, "username and password").await?;
            Ok(Credentials::Ldap {
                identity_id: identity_id.clone(),
                username: secret_key(&secret, ns, name, &["username"], what)?,
                password: secret_key(&secret, ns, name, &["password"], what)?.into(),
            })
        }
        AuthMethod::ServiceToken { secret: (ns, name) } => {
            let what = "service token";
            let secret = credentials_secret(ctx, ns, name, what, "kmsToken").await?;
            let token = secret_key(&secret, ns, name, &["kmsToken", "infisicalToken"], what)?;
            let clean: String = token.chars().filter(|c| !c.is_whitespace()).collect();
            if !clean.starts_with("st.") || clean.split('.').count() < 3 {
                return Err(SyncError::Reference {
                    reason: "CredentialsInvalid",
                    message: format!(
                        "service token Secret {ns}/{name}: kmsToken is not a service token (st.<id>.<secret>…)"
                    ),
                });
            }
            Ok(Credentials::ServiceToken {
                token: clean.into(),
            })
        }
        AuthMethod::Cloud {
            method,
            identity_id,
            azure_resource,
            azure_client_id,
            key_file,
        } => {
            if identity_id.is_empty() {
                return Err(SyncError::Spec(format!(
                    "{}: identityId is empty",
                    method.login().strategy_name()
                )));
            }
            let subject = match method {
                CloudMethod::Azure => format!(
                    "{}|{}",
                    azure_resource.as_deref().unwrap_or_default(),
                    azure_client_id.as_deref().unwrap_or_default()
                ),
                CloudMethod::GcpIam => key_file.clone().unwrap_or_default(),
                CloudMethod::AwsIam | CloudMethod::GcpIdToken => String::new(),
            };
            Ok(Credentials::Cloud {
                method: *method,
                identity_id: identity_id.clone(),
                subject,
                source: cloud::source(
                    ctx.kms.cloud(),
                    *method,
                    azure_resource.as_deref(),
                    azure_client_id.as_deref(),
                    key_file.as_deref(),
                ),
            })
        }
        AuthMethod::Unsupported(name) => Err(SyncError::Spec(format!(
            "authentication.{name} is not supported by this version of kms-operator"
        ))),
    }
}

/// The identity of a resource: its endpoint and its method's credentials,
/// checked against the host allow list.
pub async fn identity(
    ctx: &Context,
    ns: &str,
    host_api: Option<&str>,
    tls: Option<&TlsConfig>,
    method: &AuthMethod,
) -> Result<Identity, SyncError> {
    identity_with_source(ctx, ns, host_api, tls, method)
        .await
        .map(|(identity, _)| identity)
}

/// [`identity`], with where its host and CA came from (for the status).
pub async fn identity_with_source(
    ctx: &Context,
    ns: &str,
    host_api: Option<&str>,
    tls: Option<&TlsConfig>,
    method: &AuthMethod,
) -> Result<(Identity, Choice), SyncError> {
    let allow_cross = ctx.settings.allow_cross_namespace_refs;
    let global = ctx.global_config();
    let defaults = &ctx.settings.defaults;
    let choice = choose_endpoint(ns, host_api, tls, &global, defaults, allow_cross)?;
    let endpoint = resolve_endpoint(&ctx.client, &ctx.referenced, &choice).await?;
    ctx.kms.check_endpoint(&endpoint).map_err(SyncError::Kms)?;
    if let AuthMethod::Cloud {
        method,
        identity_id,
        key_file,
        ..
    } = method
    {
        // The operator's cloud identity, only where the admin allows it.
        ctx.settings
            .cloud_identities
            .check(super::cloud_identities::Use {
                namespace: ns,
                method: *method,
                identity_id,
                key_file: key_file.as_deref(),
            })
            .map_err(|message| SyncError::Reference {
                reason: "CloudIdentityNotAllowed",
                message,
            })?;
        // The trusted host follows the configured default host, wherever
        // it is read from (kms-config, else --default-host-api).
        let trusted = default_host(&global, defaults);
        trusted_for_cloud(&endpoint, trusted, ctx.kms.allowed_hosts(), *method)
            .map_err(SyncError::Auth)?;
    }
    let credentials = credentials(ctx, method).await?;
    Ok((
        Identity {
            endpoint,
            credentials,
        },
        choice,
    ))
}

/// The methods that prove the operator's own cloud identity (AWS, Azure,
/// GCP; the GCP key files are the operator's too) reach only hosts the
/// cluster admin trusts: the default `hostAPI` (the `kms-config` ConfigMap
/// in `--global-config-namespace`, else `--default-host-api`, else the
/// built-in default) and the `--allowed-kms-hosts` patterns. Anyone who may
/// create a resource could otherwise send the operator's credentials to a
/// host of their choosing.
pub fn trusted_for_cloud(
    endpoint: &Endpoint,
    global_host_api: &str,
    allowed: &[String],
    method: CloudMethod,
) -> Result<(), KmsError> {
    let global = Endpoint::new(global_host_api, None).ok();
    let same_as_global = global.as_ref().is_some_and(|g| g.origin == endpoint.origin);
    if same_as_global || (!allowed.is_empty() && host_allowed(&endpoint.host, allowed)) {
        return Ok(());
    }
    Err(KmsError::HostNotTrusted {
        method: method.field(),
        host: endpoint.origin.clone(),
        trusted: global.map_or_else(|| global_host_api.to_owned(), |g| g.origin),
    })
}

/// The identity of a push or dynamic secret (its generic authentication
/// block).
pub async fn generic_identity(
    ctx: &Context,
    ns: &str,
    host_api: Option<&str>,
    tls: Option<&TlsConfig>,
    auth: &GenericAuthentication,
) -> Result<Identity, SyncError> {
    generic_identity_with_source(ctx, ns, host_api, tls, auth)
        .await
        .map(|(identity, _)| identity)
}

/// [`generic_identity`], with where its host and CA came from.
pub async fn generic_identity_with_source(
    ctx: &Context,
    ns: &str,
    host_api: Option<&str>,
    tls: Option<&TlsConfig>,
    auth: &GenericAuthentication,
) -> Result<(Identity, Choice), SyncError> {
    let method = generic_method(auth, ns, ctx.settings.allow_cross_namespace_refs)?;
    identity_with_source(ctx, ns, host_api, tls, &method).await
}

// How a resource's authentication blocks read as methods.

/// Universal auth from a credentials reference.
pub fn universal_method(
    r: &KubeSecretReference,
    ns: &str,
    allow_cross: bool,
) -> Result<AuthMethod, SyncError> {
    let cns = namespace_of(
        ns,
        r.secret_namespace.as_deref(),
        "authentication.universalAuth.credentialsRef",
        allow_cross,
    )?;
    Ok(AuthMethod::Universal {
        credentials: (cns, r.secret_name.clone()),
    })
}

/// Kubernetes auth.
pub fn kubernetes_method(
    a: &KubernetesAuth,
    ns: &str,
    allow_cross: bool,
) -> Result<AuthMethod, SyncError> {
    let sa_ns = namespace_of(
        ns,
        a.service_account_ref.namespace.as_deref(),
        "authentication.kubernetesAuth.serviceAccountRef",
        allow_cross,
    )?;
    Ok(AuthMethod::Kubernetes {
        identity_id: a.identity_id.clone(),
        service_account: (sa_ns, a.service_account_ref.name.clone()),
        auto_token: a.auto_create_service_account_token.unwrap_or(false),
        audiences: a
            .service_account_token_audiences
            .clone()
            .unwrap_or_default(),
    })
}

/// LDAP auth.
pub fn ldap_method(a: &LdapAuth, ns: &str, allow_cross: bool) -> Result<AuthMethod, SyncError> {
    let cns = namespace_of(
        ns,
        a.credentials_ref.secret_namespace.as_deref(),
        "authentication.ldapAuth.credentialsRef",
        allow_cross,
    )?;
    Ok(AuthMethod::Ldap {
        identity_id: a.identity_id.clone(),
        credentials: (cns, a.credentials_ref.secret_name.clone()),
    })
}

fn cloud_method(method: CloudMethod, identity_id: &str) -> AuthMethod {
    AuthMethod::Cloud {
        method,
        identity_id: identity_id.trim().to_owned(),
        azure_resource: None,
        azure_client_id: None,
        key_file: None,
    }
}

/// AWS IAM auth (the pod's ambient AWS credentials).
pub fn aws_method(a: &AwsIamAuth) -> AuthMethod {
    cloud_method(CloudMethod::AwsIam, &a.identity_id)
}

/// Azure managed-identity auth.
pub fn azure_method(a: &AzureAuth) -> AuthMethod {
    let nonempty = |v: &Option<String>| {
        v.as_deref()
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    AuthMethod::Cloud {
        method: CloudMethod::Azure,
        identity_id: a.identity_id.trim().to_owned(),
        azure_resource: nonempty(&a.resource),
        azure_client_id: nonempty(&a.azure_managed_identity_client_id),
        key_file: None,
    }
}

/// GCP ID-token auth (the metadata server).
pub fn gcp_id_token_method(a: &GcpIdTokenAuth) -> AuthMethod {
    cloud_method(CloudMethod::GcpIdToken, &a.identity_id)
}

/// GCP IAM auth (a service-account key file under `--key-file-dir`).
pub fn gcp_iam_method(a: &GcpIamAuth) -> AuthMethod {
    AuthMethod::Cloud {
        method: CloudMethod::GcpIam,
        identity_id: a.identity_id.trim().to_owned(),
        azure_resource: None,
        azure_client_id: None,
        key_file: Some(a.service_account_key_file_path.trim().to_owned()),
    }
}

/// The runtime method of a spec's machine-identity method.
pub fn machine_method(
    method: Method<'_>,
    ns: &str,
    allow_cross: bool,
) -> Result<AuthMethod, SyncError> {
    Ok(match method {
        Method::Universal(a) => universal_method(&a.credentials_ref, ns, allow_cross)?,
        Method::Kubernetes(a) => kubernetes_method(a, ns, allow_cross)?,
        Method::Ldap(a) => ldap_method(a, ns, allow_cross)?,
        Method::AwsIam(a) => aws_method(a),
        Method::Azure(a) => azure_method(a),
        Method::GcpIdToken(a) => gcp_id_token_method(a),
        Method::GcpIam(a) => gcp_iam_method(a),
    })
}

/// The method of a push or dynamic secret's generic authentication block.
pub fn generic_method(
    auth: &GenericAuthentication,
    ns: &str,
    allow_cross: bool,
) -> Result<AuthMethod, SyncError> {
    let method = auth
        .method()
        .ok_or_else(|| SyncError::Spec("no authentication method is set".to_owned()))?;
    machine_method(method, ns, allow_cross)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kms::DEFAULT_HOST_API;

    #[test]
    fn the_secret_a_method_reads_is_what_the_reference_index_watches() {
        let auth =
            |v: serde_json::Value| -> GenericAuthentication { serde_json::from_value(v).unwrap() };
        let ldap = auth(serde_json::json!({"ldapAuth": {
            "identityId": "i", "credentialsRef": {"secretName": "ldap", "secretNamespace": "other"}}}));
        // The index takes namespaces as written; the reconcile applies the
        // namespace rule.
        let method = generic_method(&ldap, "ns", true).unwrap();
        assert_eq!(
            method.secret_read(),
            Some(&("other".to_owned(), "ldap".to_owned()))
        );
        assert!(generic_method(&ldap, "ns", false).is_err());
        let universal = auth(serde_json::json!({"universalAuth": {
            "credentialsRef": {"secretName": "creds"}}}));
        assert_eq!(
            generic_method(&universal, "ns", false)
                .unwrap()
                .secret_read(),
            Some(&("ns".to_owned(), "creds".to_owned()))
        );
        let kubernetes = auth(serde_json::json!({"kubernetesAuth": {
            "identityId": "i", "serviceAccountRef": {"name": "app"}}}));
        assert_eq!(
            generic_method(&kubernetes, "ns", false)
                .unwrap()
                .secret_read(),
            None
        );
    }

    #[tokio::test]
    async fn an_api_server_that_does_not_answer_is_transient_not_a_missing_secret() {
        let ctx = Context::test();
        let method = AuthMethod::Universal {
            credentials: ("ns".to_owned(), "creds".to_owned()),
        };
        let err = credentials(&ctx, &method).await.unwrap_err();
        assert!(
            matches!(err, SyncError::Kube { .. }) && err.is_transient(),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn kubernetes_and_cloud_credentials_read_nothing_until_login() {
        // The test context's API server never answers: these succeed only
        // because nothing is read before the login asks for a token.
        let ctx = Context::test();
        let kubernetes = AuthMethod::Kubernetes {
            identity_id: "id".to_owned(),
            service_account: ("ns".to_owned(), "app".to_owned()),
            auto_token: true,
            audiences: vec!["kms".to_owned()],
        };
        let c = credentials(&ctx, &kubernetes).await.unwrap();
        assert_eq!(c.strategy_name(), "KUBERNETES_AUTH_MACHINE_IDENTITY");
        assert!(format!("{c:?}").contains("ns/app|kms|true"), "{c:?}");
        let aws = AuthMethod::Cloud {
            method: CloudMethod::AwsIam,
            identity_id: String::new(),
            azure_resource: None,
            azure_client_id: None,
            key_file: None,
        };
        let err = credentials(&ctx, &aws).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            SyncError::Spec("AWS_IAM_MACHINE_IDENTITY: identityId is empty".to_owned()).to_string()
        );
    }

    #[test]
    fn cloud_identities_reach_only_trusted_hosts() {
        let ep = |url: &str| Endpoint::new(url, None).unwrap();
        let global = "https://kms.example.com/api";
        let none: Vec<String> = Vec::new();
        // The global host, whatever path prefix the resource writes.
        for ok in [
            "https://kms.example.com",
            "https://kms.example.com:443/api/",
        ] {
            assert!(
                trusted_for_cloud(&ep(ok), global, &none, CloudMethod::AwsIam).is_ok(),
                "{ok}"
            );
        }
        // Another host, port or scheme is not the global host.
        for bad in [
            "http://attacker.example/api",
            "https://kms.example.com:8443",
            "http://kms.example.com",
            "https://kms.example.com.evil.io",
        ] {
            let err = trusted_for_cloud(&ep(bad), global, &none, CloudMethod::GcpIdToken)
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("gcpIdTokenAuth logs in with the operator's own cloud identity"),
                "{err}"
            );
            assert!(err.contains("--allowed-kms-hosts"), "{err}");
            assert!(err.contains("https://kms.example.com:443"), "{err}");
        }
        // The default host when kms-config names none.
        assert!(
            trusted_for_cloud(
                &ep("https://kms.hanzo.ai"),
                DEFAULT_HOST_API,
                &none,
                CloudMethod::Azure
            )
            .is_ok()
        );
        // The allow list trusts more hosts (an empty one trusts no more).
        let allowed = vec!["*.internal".to_owned()];
        assert!(
            trusted_for_cloud(
                &ep("http://kms.internal:8080"),
                global,
                &allowed,
                CloudMethod::GcpIam
            )
            .is_ok()
        );
        assert!(
            trusted_for_cloud(
                &ep("http://kms.other"),
                global,
                &allowed,
                CloudMethod::GcpIam
            )
            .is_err()
        );
    }
}
